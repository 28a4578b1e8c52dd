"""MLX backend: Metal on macOS, CUDA on Linux, CPU as the fallback; the same engine.

The engine plans every step; this backend runs it. Every decoding request is a
row of one ``DecodeBatch`` (workers/mlx_batch.py), so all decode tokens of a step
go through ONE forward pass. A prefilling request has its own single-row mlx-lm
``KVCache`` and runs its chunk in its own pass; once it decodes, its KV joins the
batch.

Decode steps are pipelined as in mlx-lm's own generators: after answering step
n, the batch's step n+1 is already queued (``mx.async_eval``) with step n's
tokens as its input, so the device works while the engine handles tokens in
Python. When the engine's next plan is those same rows, the result is used;
rows that finished leave the batch (their speculative column is dropped) and a
row that joins rolls the speculative step back and runs a fresh one.

Prefix-cache handles are ``CachedKV``: per-layer copies of a finished request's
KV. A hit gives the new request slices of them; MLX arrays are values, so the
request's first write copies instead of touching the cached arrays.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import mlx.core as mx
import numpy as np
from mlx_lm.models import llama, qwen2
from mlx_lm.models.cache import KVCache, make_prompt_cache

from tandem.common.tokenizer import TokenizerSpec, piece_table
from tandem.workers.backends.mlx import host_state
from tandem.workers.backends.mlx.arch.gemma import MAX_CONTEXT_KEY
from tandem.workers.backends.mlx.batch import KV, DecodeBatch
from tandem.workers.backends.mlx.grammar import AVAILABLE, Grammars, consume
from tandem.workers.backends.mlx.logits import RowLogprobs
from tandem.workers.backends.mlx.model import WEIGHTS_KEY
from tandem.workers.backends.mlx.sampling import CAPABILITIES, RowState, Sampler, sample
from tandem.workers.engine import KVFull
from tandem.workers.prefix_cache import Match
from tandem.workers.request import Request

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from tandem.workers.config import WorkerConfig


def pick_device(device: str) -> tuple[mx.DeviceType, str]:
    """(MLX device, label) for ``--device auto|gpu|cpu``; ValueError if impossible."""
    gpu = "gpu-metal" if mx.metal.is_available() else "gpu-cuda" if mx.cuda.is_available() else ""
    if device == "cpu" or (device == "auto" and not gpu):
        return mx.cpu, "cpu"
    if device in ("auto", "gpu"):
        if not gpu:
            raise ValueError(
                "--device gpu: this MLX has no GPU backend (no Metal, no CUDA); "
                'install "mlx[cuda13]" on NVIDIA Linux, or use --device cpu'
            )
        return mx.gpu, gpu
    raise ValueError(f"the mlx backend takes --device auto, gpu or cpu, not {device!r}")


@dataclass
class CachedKV:
    """A prefix-cache handle: the KV of ``n_tokens`` tokens, one (keys, values) per layer."""

    layers: list[KV] | None  # None once freed
    n_tokens: int


@dataclass
class _Slot:
    req: Request
    cache: list[KVCache] | None  # a private cache while prefilling; None once in the batch
    n_tokens: int  # KV columns written, a speculative one included
    sampler: Sampler


def _head(cache: KVCache, n: int) -> KV:
    """One layer's first ``n`` positions, copied out of its (filled) cache."""
    assert cache.keys is not None and cache.values is not None  # n > 0 tokens written
    return mx.contiguous(cache.keys[..., :n, :]), mx.contiguous(cache.values[..., :n, :])


@dataclass
class _Pending:
    """A decode step queued ahead for the batch's rows, in row order."""

    tokens: mx.array
    states: list[RowState]
    logprobs: RowLogprobs | None


class MlxBackend:
    """An mlx-lm model serving the engine's batches on one MLX device."""

    name = "mlx"
    capabilities = CAPABILITIES
    pipeline = True  # queue each decode step ahead (off: to measure what it buys)

    @classmethod
    def from_config(cls, cfg: WorkerConfig, model: Path) -> MlxBackend:
        cache = cfg.engine.cache_tokens or 0  # the prefix cache's own KV (workers/memory.py)
        return cls(model, n_ctx=cfg.n_ctx, device=cfg.device, cache_tokens=cache)

    def __init__(
        self,
        model_path: str | Path,
        n_ctx: int = 8192,
        device: str = "auto",
        loaded: tuple[Any, TokenizerSpec, dict[str, Any]] | None = None,
        cache_tokens: int = 0,
    ) -> None:
        """Load ``model_path`` (GGUF file or mlx-lm folder), or use ``loaded``
        (an already built ``(model, spec, config)``, e.g. ``make_tiny_model()``)."""
        mx_device, self.device = pick_device(device)
        self._stream = mx.new_stream(mx_device)
        if loaded is None:
            from tandem.workers.backends.mlx.model import load_mlx_model

            with mx.stream(self._stream):
                loaded = load_mlx_model(model_path)
        model, self.tokenizer_spec, config = loaded
        self.model: Any = model  # an mlx-lm Model: called on ids with a cache
        if not all(isinstance(c, KVCache) for c in make_prompt_cache(self.model)):
            raise ValueError("the mlx backend needs a model with plain KV caches (no sliding)")
        self.model_name = Path(model_path).name  # as llama.cpp's backend reports it
        self.weights_digest = str(config.get(WEIGHTS_KEY, ""))
        self.n_ctx = n_ctx
        max_context = config.get(MAX_CONTEXT_KEY)
        if max_context and n_ctx > max_context:  # e.g. Gemma 2's sliding window, see arch/gemma
            log.warning("n_ctx %d capped at %d for this model on MLX", n_ctx, max_context)
            self.n_ctx = int(max_context)
        self.vocab_size = int(config["vocab_size"])
        self._eog = frozenset(self.tokenizer_spec.eos_ids)
        self._grammars = Grammars(self.tokenizer_spec, self.vocab_size) if AVAILABLE else None
        self._pieces = piece_table(self.tokenizer_spec, self.vocab_size)
        # Only llama's and qwen2's heads are known to be plain projections we may apply
        # to one position.
        self._split_head = isinstance(self.model, llama.Model | qwen2.Model)
        self._batch = DecodeBatch()
        self._pending: _Pending | None = None
        self._slots: list[_Slot] = []
        self._held_tokens = 0  # KV tokens in live cache handles
        self.cache_tokens = cache_tokens  # room for them beyond the n_ctx of active requests
        self.prompt_tokens_fed = 0  # prefix-cache hits skip theirs
        self.decode_passes = 0  # batched forward passes (speculative ones included)
        self.speculation_dropped = 0

    @classmethod
    def from_model(
        cls,
        loaded: tuple[Any, TokenizerSpec, dict[str, Any]],
        name: str = "mlx-model",
        **kwargs: Any,
    ) -> MlxBackend:
        """A backend around an already built model (tests: ``make_tiny_model()``)."""
        return cls(name, loaded=loaded, **kwargs)

    # ------------------------------------------------------------ slots
    def begin(self, req: Request, match: Match) -> None:
        cache = make_prompt_cache(self.model)
        entry = match.entry
        n = match.n_tokens if entry is not None else 0
        if entry is not None and n:
            for c, (k, v) in zip(cache, entry.handle.layers, strict=True):
                c.keys, c.values, c.offset = k[..., :n, :], v[..., :n, :], n
        matcher = self._matcher(req) if req.sampling.json_schema is not None else None
        sampler = Sampler.create(req.sampling, req.prompt, req.resumed, self.vocab_size, matcher)
        req.slot = slot = _Slot(req, cache, n, sampler)
        self._slots.append(slot)

    def end(self, req: Request) -> CachedKV:
        slot: _Slot = req.slot
        req.slot = None
        self._slots.remove(slot)
        n = len(req.kv_tokens())
        with mx.stream(self._stream):
            if slot.cache is None:
                layers = self._batch.extract(slot, n)
                self._leave_batch(slot)
            elif n:
                layers = [_head(c, n) for c in slot.cache]
            else:
                layers = []
            mx.async_eval(layers)  # materialize now, so the copy holds no big buffer alive
        self._held_tokens += n
        return CachedKV(layers, n)

    def free(self, handle: CachedKV) -> None:
        if handle.layers is not None:
            self._held_tokens -= handle.n_tokens
            handle.layers = None

    def save(self, handle: CachedKV) -> host_state.HostKV | None:
        """The prefix cache's host tier: host-RAM copies of a cached entry's KV."""
        return host_state.save(handle.layers, handle.n_tokens)

    def restore(self, state: host_state.HostKV) -> CachedKV:
        layers = host_state.load(state, self._stream)
        self._held_tokens += state.n_tokens
        return CachedKV(layers, state.n_tokens)

    # ------------------------------------------------------------ the step
    def run(self, decode: list[Request], prefill: list[tuple[Request, int]]) -> dict[str, int]:
        self._check_room(decode, prefill)
        with mx.stream(self._stream):
            joining = [r.slot for r in decode if r.slot.cache is not None]
            if joining:
                self._drop_pending()
                for slot in joining:
                    self._batch.add(slot, [(c.keys, c.values) for c in slot.cache], slot.n_tokens)
                    slot.cache = None
            rows: list[_Slot] = list(self._batch.rows) if decode else []
            if len(rows) != len(decode):
                raise RuntimeError("decode requests and batch rows differ")
            parts: list[mx.array] = []
            asked: list[tuple[list[Request], RowLogprobs]] = []  # logprobs, by part
            if rows:
                tokens, lps = self._decode(rows)
                parts.append(tokens)
                if lps is not None:
                    asked.append(([s.req for s in rows], lps))
            owners = [s.req.id for s in rows]
            kv_written: list[mx.array] = []
            for r, n in prefill:
                token, lps = self._prefill(r, n)
                kv_written += [a for c in r.slot.cache for a in (c.keys, c.values)]
                if token is not None:
                    parts.append(token)
                    owners.append(r.id)
                if lps is not None:
                    asked.append(([r], lps))
            out = (mx.concatenate(parts) if len(parts) > 1 else parts[0]) if parts else None
            lp_arrays = [a for _, lps in asked for a in lps.arrays()]
            mx.async_eval(*([out] if out is not None else []), kv_written, *lp_arrays)
            joins_next = any(
                r.n_computed + n == len(r.prompt) and not r.prefill_only for r, n in prefill
            )
            if rows and self.pipeline and not joins_next:  # a join would drop it anyway
                self._speculate(rows, parts[0])
            values = cast(list[int], out.tolist()) if out is not None else []  # token ids
            self._advance_grammars(dict(zip(owners, values, strict=True)))
            for reqs, lps in asked:
                lps.hand_to(reqs)
            mx.eval(kv_written)  # this step's prefill is done when run returns
        return dict(zip(owners, values, strict=True))

    def _check_room(self, decode: list[Request], prefill: list[tuple[Request, int]]) -> None:
        """KVFull before any state changes, so the engine can free cache and retry."""
        ahead = len(self._batch) if self._pending is not None else 0
        in_use = sum(s.n_tokens for s in self._slots) - ahead + self._held_tokens
        if in_use + len(decode) + sum(n for _, n in prefill) > self.n_ctx + self.cache_tokens:
            raise KVFull()

    def _decode(self, rows: list[_Slot]) -> tuple[mx.array, RowLogprobs | None]:
        """This step's tokens (and logprobs) for the batch rows: the queued step's,
        or a fresh pass."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            for s in rows:
                if len(s.req.prompt) + s.req.n_fed + 1 != s.n_tokens:
                    raise RuntimeError(f"request {s.req.id}: speculative step out of line")
        else:
            pending = self._batch_pass(rows, mx.array([s.req.output[-1] for s in rows]))
        for s, state in zip(rows, pending.states, strict=True):
            s.sampler.state = state
        return pending.tokens, pending.logprobs

    def _speculate(self, rows: list[_Slot], tokens: mx.array) -> None:
        """Queue the next decode step now, fed this step's (still lazy) tokens."""
        if all(len(s.req.output) + 1 >= s.req.max_tokens for s in rows):
            return  # every row ends at this token
        if any(s.sampler.matcher is not None for s in rows):
            return  # a grammar's next mask needs this step's token (grammar.py)
        pending = self._batch_pass(rows, tokens)
        mx.async_eval(pending.tokens, *(pending.logprobs.arrays() if pending.logprobs else []))
        self._pending = pending

    def _batch_pass(self, rows: list[_Slot], tokens: mx.array) -> _Pending:
        logits = self._batch.forward(self.model, tokens)
        for s in rows:
            s.n_tokens += 1
        self.decode_passes += 1
        logits = self._forbid_eog(logits, [s.n_tokens - len(s.req.prompt) for s in rows], rows)
        return _Pending(*sample(logits, [s.sampler for s in rows]))

    def _forbid_eog(self, logits: mx.array, index: list[int], rows: list[_Slot]) -> mx.array:
        """min_tokens: no end-of-generation token in a row whose output token ``index``
        (0: the first) comes before its request's ``min_tokens``."""
        early = [i for i, (n, s) in enumerate(zip(index, rows, strict=True))
                 if n < s.req.sampling.min_tokens]  # fmt: skip
        if not early or not self._eog:
            return logits
        mask = np.zeros(logits.shape, np.float32)
        mask[np.ix_(early, sorted(self._eog))] = -np.inf
        return logits + mx.array(mask)

    def _drop_pending(self) -> None:
        if self._pending is not None:
            self._pending = None
            self._batch.rollback()
            for s in self._batch.rows:
                s.n_tokens -= 1
            self.speculation_dropped += 1

    def _leave_batch(self, slot: _Slot) -> None:
        b = self._batch.remove(slot)
        if self._pending is None:
            return
        if not self._batch.rows:
            self._pending = None
            return
        keep = [i for i in range(len(self._pending.states)) if i != b]
        self._pending.tokens = mx.take(self._pending.tokens, mx.array(keep))
        del self._pending.states[b]
        if self._pending.logprobs is not None:
            self._pending.logprobs = self._pending.logprobs.select(keep)

    def _prefill(self, req: Request, n: int) -> tuple[mx.array | None, RowLogprobs | None]:
        """Feed the next ``n`` prompt tokens; the sampled token (and its logprobs, if
        asked) if the prompt ends here."""
        slot: _Slot = req.slot
        assert slot.cache is not None  # its own until the prompt is in: then it joins the batch
        start = req.n_computed
        ids = mx.array([req.prompt[start : start + n]])
        self.prompt_tokens_fed += n
        slot.n_tokens += n
        if start + n < len(req.prompt) or req.prefill_only:
            self.model(ids, cache=slot.cache)  # KV only: the logits are never evaluated
            return None, None
        logits = self._forbid_eog(self._last_logits(ids, slot.cache), [0], [slot])
        token, (state,), lps = sample(logits, [slot.sampler])
        slot.sampler.state = state
        return token, lps

    def _last_logits(self, ids: mx.array, cache: list[KVCache]) -> mx.array:
        """Logits of the last position only: the head over a whole chunk costs
        chunk x hidden x vocab, more than the rest of a small model."""
        if not self._split_head:
            return self.model(ids, cache=cache)[:, -1, :]
        h = self.model.model(ids, cache)[:, -1:, :]
        if self.model.args.tie_word_embeddings:
            return self.model.model.embed_tokens.as_linear(h)[:, -1, :]
        return self.model.lm_head(h)[:, -1, :]

    # ------------------------------------------------------------ json_schema
    def problem(self, req: Request) -> str | None:
        """Why this backend cannot serve ``req``'s json_schema, or None (on arrival)."""
        if req.sampling.json_schema is None or self._grammars is None:
            return None
        return self._grammars.problem(req.sampling.json_schema, req.resumed_output())

    def _matcher(self, req: Request) -> Any:
        if self._grammars is None or req.sampling.json_schema is None:
            raise ValueError("this worker cannot serve json_schema (llguidance is missing)")
        return self._grammars.matcher(req.sampling.json_schema, req.resumed_output())

    def _advance_grammars(self, produced: dict[str, int]) -> None:
        for s in self._slots:
            if s.sampler.matcher is not None and s.req.id in produced:
                consume(s.sampler.matcher, produced[s.req.id])

    # ------------------------------------------------------------ tokens
    def piece(self, token: int) -> bytes:
        return self._pieces[token]

    def is_eog(self, token: int) -> bool:
        return token in self._eog
