"""llama.cpp backend: one context, many sequences, on llama-cpp-python's low-level API.

The high-level ``Llama`` class cannot batch sequences, so this drives
``llama_decode`` directly. The KV pool is *unified* (``kv_unified=True``): all
sequences share ``n_ctx`` cells, and ``llama_memory_seq_cp`` of a prefix is a
metadata operation, so a prefix-cache hit shares the cached KV cells instead of
recomputing or copying them. (In non-unified mode a partial ``seq_cp`` aborts the
process.) Sequence ids are a fixed pool: one per active request plus one per
cache entry.
"""

from __future__ import annotations

import ctypes
import logging
from pathlib import Path
from typing import TYPE_CHECKING

import llama_cpp as L
import numpy as np

from tandem.common.gguf_file import weights_digest
from tandem.common.tokenizer import TokenizerSpec, tokenizer_spec_from_gguf
from tandem.workers.backends import llama_rows, llama_sampling, llama_state
from tandem.workers.backends.llama_params import is_gpu, placement
from tandem.workers.backends.llama_weights import served_weights
from tandem.workers.engine import KVFull
from tandem.workers.prefix_cache import Match
from tandem.workers.request import Request

if TYPE_CHECKING:
    from tandem.workers.config import WorkerConfig

log = logging.getLogger(__name__)


@L.llama_log_callback
def _quiet_log(level: int, text: bytes, user_data: object) -> None:  # a ctypes callback
    if level == 4:  # GGML_LOG_LEVEL_ERROR (5 is CONT: continuation of any level)
        log.error("llama.cpp: %s", text.decode(errors="replace").rstrip())


_backend_ready = False


def _init_backend() -> None:
    global _backend_ready
    if not _backend_ready:
        L.llama_log_set(_quiet_log, ctypes.c_void_p())
        L.llama_backend_init()
        _backend_ready = True


class LlamaBackend:
    """A llama.cpp model + context serving up to ``max_active`` sequences at once."""

    name = "llama.cpp"
    capabilities = llama_sampling.CAPABILITIES

    @classmethod
    def from_config(cls, cfg: WorkerConfig, model: Path) -> LlamaBackend:
        device = "cpu" if cfg.device == "auto" else cfg.device
        served, fmt = model, ""
        if not is_gpu(device):  # a GPU's kernels batch every type: the file as given
            _init_backend()  # llama.cpp's log routed before it loads anything
            served, fmt = served_weights(model, cfg.weights, cfg.threads)
        return cls(
            served,
            source=model,
            weights_format=fmt,
            n_ctx=cfg.n_ctx,
            threads=cfg.threads,
            max_active=cfg.engine.max_active,
            cache_entries=cfg.engine.cache_entries,
            step_tokens=cfg.engine.step_tokens,
            device=device,
            cache_tokens=cfg.engine.cache_tokens or 0,
        )

    def __init__(
        self,
        model_path: str | Path,
        n_ctx: int = 8192,
        threads: int = 2,
        max_active: int = 4,
        cache_entries: int | None = 16,
        step_tokens: int = 256,
        device: str = "cpu",
        cache_tokens: int = 0,
        source: str | Path | None = None,
        weights_format: str = "",
    ) -> None:
        """``n_ctx`` KV cells for active requests, ``cache_tokens`` more for the prefix
        cache's device tier (workers/memory.py sizes it). ``model_path`` is the file
        loaded, ``source`` the model it was converted from (``weights_format``, e.g.
        "q8_0": llama_weights.py), which names and identifies what is served."""
        _init_backend()
        self.model_path = Path(model_path)
        # gpu / gpu-*: every layer and the KV on the GPU of a CUDA/Metal build; cpu: no
        # GPU at all, also in such a build (llama_params.py).
        place = placement(device)
        mparams, _devices = place.model_params()
        self.model = L.llama_model_load_from_file(str(self.model_path).encode(), mparams)
        if not self.model:
            raise ValueError(f"llama.cpp could not load model {self.model_path}")
        self.vocab = L.llama_model_get_vocab(self.model)
        self.vocab_size = L.llama_vocab_n_tokens(self.vocab)
        cparams = L.llama_context_default_params()
        cparams.n_ctx = n_ctx + cache_tokens
        place.tune_context(cparams, step_tokens)
        cparams.n_seq_max = llama_state.sequences(max_active, cache_entries, step_tokens)
        cparams.n_threads = cparams.n_threads_batch = threads
        cparams.kv_unified = True
        self.ctx = L.llama_init_from_model(self.model, cparams)
        if not self.ctx:
            raise ValueError("llama.cpp could not create a context (n_ctx too large?)")
        self.n_ctx = L.llama_n_ctx(self.ctx) - cache_tokens
        self.max_cache_entries = cparams.n_seq_max - max_active - 1
        self.mem = L.llama_get_memory(self.ctx)
        self.free_seqs = list(range(cparams.n_seq_max - 1, -1, -1))
        self.batch = L.llama_batch_init(step_tokens, 0, 1)
        self.batch_cap = step_tokens
        self.device = device
        source = Path(source) if source is not None else self.model_path
        self.model_name = source.name
        self.weights_format = weights_format  # "" the file as given; its profile's key too
        self.weights_digest = weights_digest(source)
        self.threads = threads
        self.tokenizer_spec: TokenizerSpec = tokenizer_spec_from_gguf(self.model_path)
        self._pieces: dict[int, bytes] = {}
        self._eog: np.ndarray | None = None  # end-of-generation ids, found on first need
        # Rows a decode call carries: all of a step's (one call) where rows batch, else 1,
        # each row and the step's prompt chunks a call of their own (llama_rows.py).
        # A prompt chunk below ``min_chunk_tokens`` costs much more a token (the engine
        # never cuts one smaller to keep a step within its time budget).
        self.rows_per_call, self.min_chunk_tokens = (
            (None, 1) if place.gpu else llama_rows.probed(self)
        )

    # ------------------------------------------------------------ slots
    def begin(self, req: Request, match: Match) -> None:
        chain = llama_sampling.build_chain(req, self.vocab, self.vocab_size, self.n_ctx)
        seq = self.free_seqs.pop()
        L.llama_memory_seq_rm(self.mem, seq, -1, -1)
        if match.entry is not None and match.n_tokens > 0:
            # Shares the cached cells (unified KV): no prefill, no copy.
            L.llama_memory_seq_cp(self.mem, match.entry.handle, seq, 0, match.n_tokens)
        req.slot = seq
        req.sampler = chain

    def live_handle(self, req: Request) -> int:
        """An active request's sequence: ``begin`` shares a prefix of its cells as it
        shares a cache entry's (the engine's in-flight prefix sharing)."""
        return int(req.slot)

    def end(self, req: Request) -> int:
        llama_sampling.free_chain(req.sampler)
        req.sampler = None
        seq, req.slot = req.slot, None
        return seq

    def free(self, handle: int) -> None:
        L.llama_memory_seq_rm(self.mem, handle, -1, -1)
        self.free_seqs.append(handle)

    def save(self, handle: int) -> llama_state.SeqState | None:
        """The prefix cache's host tier: a host-RAM copy of a cached sequence."""
        return llama_state.save(self, handle)

    def restore(self, state: llama_state.SeqState) -> int | None:
        return llama_state.restore(self, state)

    # ------------------------------------------------------------ the step
    def run(self, decode: list[Request], prefill: list[tuple[Request, int]]) -> dict[str, int]:
        if self.rows_per_call is None:
            return self._call(decode, prefill)
        out: dict[str, int] = {}
        ran: list[str] = []
        try:
            for r in decode:
                out.update(self._call([r], []))
                ran.append(r.id)
            if prefill:
                out.update(self._call([], prefill))
        except KVFull:
            if ran:  # the rows before it ran: the engine keeps them (engine.KVFull)
                raise KVFull(tuple(ran), out) from None
            raise
        return out

    def _call(self, decode: list[Request], prefill: list[tuple[Request, int]]) -> dict[str, int]:
        """One ``llama_decode`` of these rows and chunks; their sampled tokens."""
        rows: list[tuple[Request, int]] = []  # (request, batch index of its logits)
        n = 0
        for r in decode:
            n = self.put(n, r.output[-1], len(r.prompt) + r.n_fed, r.slot, True)
            rows.append((r, n - 1))
        for r, k in prefill:
            end = r.n_computed + k
            for pos in range(r.n_computed, end):
                last = pos == len(r.prompt) - 1
                n = self.put(n, r.prompt[pos], pos, r.slot, last and not r.prefill_only)
            if end == len(r.prompt) and not r.prefill_only:
                rows.append((r, n - 1))
        self.decode_batch(n)
        for r, i in rows:
            if len(r.output) < r.sampling.min_tokens:
                self._forbid_eog(i)
        return {r.id: llama_sampling.sample(r, self.ctx, i, self.vocab_size) for r, i in rows}

    def decode_batch(self, n: int) -> None:
        """``llama_decode`` of the batch's first ``n`` tokens (KVFull when no cell is free)."""
        self.batch.n_tokens = n
        rc = L.llama_decode(self.ctx, self.batch)
        if rc == 1:
            raise KVFull()
        if rc != 0:
            raise RuntimeError(f"llama_decode failed with {rc}")

    def _forbid_eog(self, index: int) -> None:
        """min_tokens: no end-of-generation token from batch row ``index`` (its logits
        are what the sampler chain reads)."""
        if self._eog is None:
            self._eog = np.array([t for t in range(self.vocab_size) if self.is_eog(t)], int)
        logits = np.ctypeslib.as_array(L.llama_get_logits_ith(self.ctx, index), (self.vocab_size,))
        logits[self._eog] = -np.inf

    def put(self, n: int, token: int, pos: int, seq: int, logits: bool) -> int:
        if n >= self.batch_cap:
            raise RuntimeError("step larger than the batch the context was built for")
        b = self.batch
        b.token[n], b.pos[n], b.n_seq_id[n] = token, pos, 1
        b.seq_id[n][0] = seq
        b.logits[n] = 1 if logits else 0
        return n + 1

    def problem(self, req: Request) -> str | None:
        """Why this backend cannot serve ``req``'s sampling, or None (engine._check)."""
        return llama_sampling.request_problem(req, self.vocab)

    # ------------------------------------------------------------ tokens
    def piece(self, token: int) -> bytes:
        """Special tokens as their text: one kept in the output (ignore_eos, min_tokens,
        a control token that does not end generation) is streamed, so the text says
        every token the usage counts."""
        out = self._pieces.get(token)
        if out is None:
            buf = ctypes.create_string_buffer(64)
            n = L.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, True)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = L.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, True)
            out = self._pieces[token] = buf.raw[:n]
        return out

    def is_eog(self, token: int) -> bool:
        return bool(L.llama_vocab_is_eog(self.vocab, token))

    def close(self) -> None:
        L.llama_batch_free(self.batch)
        L.llama_free(self.ctx)
        L.llama_model_free(self.model)
