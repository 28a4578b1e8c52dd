"""The continuous-batching engine every backend shares.

The engine owns the FIFO queue, the set of active requests (at most
``max_active``), the prefix cache index and all request bookkeeping. A backend
only runs model steps on the batches the engine plans (see ``Backend``). The
engine runs on the compute thread; it receives messages through ``inbox`` and
sends through ``emit`` (both provided by the I/O thread, workers/io.py).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from tandem.common import protocol as p
from tandem.common.tokenizer import TokenizerSpec
from tandem.workers.prefix_cache import Match, PrefixCache
from tandem.workers.request import Request, Status

log = logging.getLogger(__name__)


class KVFull(Exception):
    """The backend has no KV room for this step; the engine frees some and retries."""


class Backend(Protocol):
    """What a model backend provides; everything else lives in the engine."""

    name: str  # "llama.cpp", "mlx", "sim"
    device: str  # label shown to users and matched by forced:<selector>
    model_name: str
    weights_digest: str  # common.gguf_file.weights_digest of the served weights ("" unknown)
    n_ctx: int  # KV cells shared by all sequences
    vocab_size: int
    tokenizer_spec: TokenizerSpec

    def begin(self, req: Request, match: Match) -> None:
        """Give ``req`` a slot whose KV starts with ``match.n_tokens`` cached tokens."""

    def run(self, decode: list[Request], prefill: list[tuple[Request, int]]) -> dict[str, int]:
        """One model step: feed each decode request its last token and each prefill
        request its next n prompt tokens. Returns the sampled token of every request
        whose logits were produced (decodes, and prefills that reached their end).
        Raises KVFull when the step does not fit."""

    def end(self, req: Request) -> Any:
        """Detach ``req``'s slot; returns a handle the prefix cache may keep."""

    def free(self, handle: Any) -> None:
        """Release a cache handle."""

    def piece(self, token: int) -> bytes:
        """The bytes of one token (for incremental detokenization)."""

    def is_eog(self, token: int) -> bool: ...


@dataclass(frozen=True)
class EngineConfig:
    max_active: int = 4
    step_tokens: int = 256  # per-step token budget: decode tokens first, then prefill chunks
    block_size: int = 16
    cache_tokens: int = 4096  # prefix cache budget (KV tokens kept after requests end)
    cache_entries: int = 16
    heartbeat_s: float = 0.5
    max_tokens_limit: int = 4096
    full_resync_s: float = 30.0  # a full block listing this often, whatever the deltas said

    def __post_init__(self) -> None:
        if self.max_active < 1:
            raise ValueError("max_active must be >= 1")
        if self.step_tokens < self.max_active:
            raise ValueError("step_tokens must be >= max_active (one decode token each)")
        if self.block_size < 1 or self.heartbeat_s <= 0:
            raise ValueError("block_size must be >= 1 and heartbeat_s > 0")
        if self.cache_tokens < 0 or self.cache_entries < 0 or self.max_tokens_limit < 1:
            raise ValueError("cache_tokens, cache_entries >= 0 and max_tokens_limit >= 1")


class Engine:
    def __init__(
        self,
        backend: Backend,
        config: EngineConfig,
        emit: Callable[[p.Message], None],
        worker_id: str,
        inbox: queue.Queue[p.Message] | None = None,
    ) -> None:
        self.backend = backend
        self.cfg = config
        self.emit = emit
        self.worker_id = worker_id
        self.inbox: queue.Queue[p.Message] = inbox if inbox is not None else queue.Queue()
        self.queue: deque[Request] = deque()
        self.active: list[Request] = []
        self.cache = PrefixCache(config.block_size, config.cache_tokens, config.cache_entries)
        self._changed = True
        self._hb_seq = 0
        self._last_hb = 0.0
        self._last_full = time.monotonic()

    # ------------------------------------------------------------ the loop
    def run(self, stop: threading.Event) -> None:
        """Drain the inbox (blocking only when idle), step, report; until ``stop``."""
        while not stop.is_set():
            self.drain_inbox(block=not (self.queue or self.active))
            if self.queue or self.active:
                self.step()
            self.maybe_heartbeat()

    def drain_inbox(self, block: bool) -> None:
        try:
            msg = self.inbox.get(timeout=self.cfg.heartbeat_s) if block else self.inbox.get_nowait()
            while True:
                self.handle(msg)
                msg = self.inbox.get_nowait()
        except queue.Empty:
            pass

    def step(self) -> None:
        """Admit -> build batch -> run -> sample -> emit."""
        self.admit()
        decode = [r for r in self.active if r.status is Status.DECODE]
        budget = self.cfg.step_tokens - len(decode)
        prefill: list[tuple[Request, int]] = []
        for r in self.active:
            if r.status is Status.PREFILL and budget > 0:
                n = min(r.prefill_remaining, budget)
                prefill.append((r, n))
                budget -= n
        if not decode and not prefill:
            return
        sampled = self._run(decode, prefill)
        if sampled is None:
            return
        for r in decode:
            r.n_fed += 1
        for r, n in prefill:
            r.n_computed += n
            if r.prefill_remaining == 0:
                self._prefill_done(r)
        for r in decode + [r for r, _ in prefill]:
            token = sampled.get(r.id)
            if token is not None and r.status is Status.DECODE:
                self._on_token(r, token)

    # ------------------------------------------------------------ messages
    def handle(self, msg: p.Message) -> None:
        if isinstance(msg, p.Assign):
            self.submit(Request.from_assign(msg))
        elif isinstance(msg, p.Cancel):
            self.cancel(msg.request_id)
        elif isinstance(msg, p.ResyncCache):
            self.cache.log.request_full()
            self._changed = True
        else:
            log.warning("engine ignores %s", msg.TYPE)

    def submit(self, req: Request) -> None:
        problem = self._check(req)
        if problem:
            self.emit(p.Error(problem[0], problem[1], req.id))
            return
        self.queue.append(req)
        self._changed = True

    def cancel(self, request_id: str) -> None:
        for r in self.queue:
            if r.id == request_id:
                self.queue.remove(r)
                r.t_done = time.monotonic()
                self.emit(p.Done(r.id, "cancelled", self._stats(r)))
                self._changed = True
                return
        for r in self.active:
            if r.id == request_id:
                self.finish(r, "cancelled")
                return
        # Unknown or already finished: cancel is idempotent.

    # ------------------------------------------------------------ bookkeeping
    def can_admit(self, req: Request) -> bool:
        reserved = sum(self._reservation(r) for r in self.active)
        return (
            len(self.active) < self.cfg.max_active
            and reserved + self._reservation(req) <= self.backend.n_ctx
        )

    def admit(self) -> None:
        while self.queue and self.can_admit(self.queue[0]):
            req = self.queue.popleft()
            match = self.cache.match(req.prompt)
            if match.entry is not None:
                self.cache.pin(match.entry)
            try:
                self.backend.begin(req, match)
            finally:
                if match.entry is not None:
                    self.cache.unpin(match.entry)
            req.n_cached = req.n_computed = match.n_tokens
            req.status = Status.PREFILL
            req.t_admit = time.monotonic()
            self.active.append(req)
            self._changed = True

    def finish(self, req: Request, reason: str, notify: bool = True) -> None:
        req.status = Status.FINISHED
        req.finish_reason = reason
        req.t_done = time.monotonic()
        tail = req.text.flush() if reason in ("length", "eos") else ""
        if tail:
            self.emit(p.TokenDelta(req.id, [], tail))
        self.active.remove(req)
        handle = self.backend.end(req)
        if reason == "error":  # its KV is what we are short of (or is suspect): drop it
            to_free = [handle]
        else:
            _, to_free = self.cache.insert(req.kv_tokens(), handle)
        for h in to_free:
            self.backend.free(h)
        if notify:
            self.emit(p.Done(req.id, reason, self._stats(req)))
        self._changed = True

    def _run(self, decode: list[Request], prefill: list[tuple[Request, int]]) -> dict | None:
        """backend.run, evicting cache entries while the KV pool is full.

        None when the step could not run: then the requests it had to give up
        have already been failed (one per retry when KV is exhausted, all of the
        step's requests when the backend itself failed).
        """
        while True:
            try:
                return self.backend.run(decode, prefill)
            except KVFull:
                if self._make_room():
                    continue
                victim = self.active[-1]  # newest admitted: least work lost
                self._fail([victim], p.OVERLOADED, "KV cache full; retry later")
                return None
            except Exception as exc:  # a backend failure fails its step, not the worker
                log.exception("backend step failed")
                self._fail(decode + [r for r, _ in prefill], p.WORKER_ERROR, f"backend: {exc}")
                return None

    def _make_room(self) -> bool:
        handle = self.cache.evict_one()
        if handle is None:
            return False
        self.backend.free(handle)
        self._changed = True
        return True

    def _fail(self, reqs: list[Request], code: str, message: str) -> None:
        for r in reqs:
            if r.status is not Status.FINISHED:
                self.emit(p.Error(code, message, r.id))
                self.finish(r, "error", notify=False)

    def _prefill_done(self, req: Request) -> None:
        if req.prefill_only:
            self.finish(req, "prefill_only")
            return
        req.status = Status.DECODE
        req.t_first = time.monotonic()

    def _on_token(self, req: Request, token: int) -> None:
        if self.backend.is_eog(token) and not req.ignore_eos:
            self.finish(req, "eos")
            return
        req.output.append(token)
        text = req.text.feed(self.backend.piece(token))
        self.emit(p.TokenDelta(req.id, [token], text))
        if req.text.stopped:
            self.finish(req, "stop")
        elif len(req.output) >= req.max_tokens:
            self.finish(req, "length")

    def _check(self, req: Request) -> tuple[str, str] | None:
        if not req.prompt:
            return p.BAD_REQUEST, "empty prompt"
        if any(t < 0 or t >= self.backend.vocab_size for t in req.prompt):
            return p.BAD_REQUEST, "token id out of the model's vocabulary"
        if not req.prefill_only and not 1 <= req.max_tokens <= self.cfg.max_tokens_limit:
            return p.BAD_REQUEST, f"max_tokens must be in 1..{self.cfg.max_tokens_limit}"
        if self._reservation(req) > self.backend.n_ctx:
            return p.PROMPT_TOO_LONG, (
                f"prompt ({len(req.prompt)}) + max_tokens ({req.max_tokens}) exceeds "
                f"the worker's context ({self.backend.n_ctx})"
            )
        if any(r.id == req.id for r in [*self.queue, *self.active]):
            return p.DUPLICATE_REQUEST, f"request {req.id!r} is already here"
        return None

    @staticmethod
    def _reservation(req: Request) -> int:
        return len(req.prompt) + (0 if req.prefill_only else req.max_tokens)

    def _stats(self, req: Request) -> dict[str, Any]:
        return {**req.stats(), "worker": self.worker_id}

    # ------------------------------------------------------------ heartbeats
    def maybe_heartbeat(self) -> None:
        now = time.monotonic()
        if now - self._last_full >= self.cfg.full_resync_s:
            self.cache.log.request_full()  # heals any delta the router silently lost
            self._last_full = now
        if self._changed or now - self._last_hb >= self.cfg.heartbeat_s:
            self.emit(self.heartbeat())
            self._last_hb = now
            self._changed = False

    def heartbeat(self) -> p.Heartbeat:
        self._hb_seq += 1
        return p.Heartbeat(
            worker_id=self.worker_id,
            seq=self._hb_seq,
            active=[r.summary() for r in self.active],
            queued=[r.summary() for r in self.queue],
            kv_used_tokens=sum(len(r.kv_tokens()) for r in self.active) + self.cache.tokens_held,
            kv_capacity_tokens=self.backend.n_ctx,
            cache=self.cache.log.report(),
        )
