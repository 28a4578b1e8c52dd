"""The continuous-batching engine every backend shares.

The engine owns the FIFO queue, the set of active requests (at most
``max_active``), the prefix cache index and all request bookkeeping. A backend
only runs model steps on the batches the engine plans (see ``EngineBackend``). The
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
from typing import Any, Literal, Protocol

from tandem.common import protocol as p
from tandem.common.protocol import FinishReason
from tandem.common.schedule import admissible, plan_step, reservation
from tandem.common.tokenizer import TokenizerSpec
from tandem.workers.config import EngineConfig
from tandem.workers.host_cache import make_cache, restored
from tandem.workers.prefix_cache import Entry, Match
from tandem.workers.request import (
    Request,
    Status,
    decode_context,
    prefix_leader,
    sampling_problem,
    wire_logprob,
)
from tandem.workers.steptimer import StepTimer

log = logging.getLogger(__name__)


class KVFull(Exception):
    """The backend has no KV room for this step; the engine frees some and retries.

    A backend that runs a step as several calls (llama_rows.py) may fill the pool after
    some of them ran: ``ran`` names the requests whose part of the step did run (their
    KV written, their tokens in ``tokens``), and the engine keeps that part: running it
    again would write their cells twice and sample their chains twice."""

    def __init__(self, ran: tuple[str, ...] = (), tokens: dict[str, int] | None = None) -> None:
        super().__init__("KV cache full")
        self.ran = ran
        self.tokens = tokens or {}


# What the I/O thread (or the twin) hands the engine its messages through.
Inbox = queue.Queue[p.Message] | queue.SimpleQueue[p.Message]


class EngineBackend(Protocol):
    """What the engine needs of a model backend; everything else lives in the engine.
    (The twin's device is one, on a virtual clock.)"""

    name: str  # "llama.cpp", "mlx", "sim"
    device: str  # label shown to users and matched by forced:<selector>
    model_name: str
    n_ctx: int  # KV cells shared by all sequences
    vocab_size: int
    # The sampling capabilities it serves (protocol.Capability values, Ready.capabilities);
    # it may also define ``problem(req) -> str | None``: why it cannot serve a request
    # (checked on arrival, so that ``begin`` never meets one).
    capabilities: tuple[str, ...]

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

    # Optional: ``min_chunk_tokens``, the smallest prompt chunk its kernels run well (a
    # step's time budget never cuts one below it; llama_rows.py measures it on a CPU).
    # Optional, for a host-RAM tier (workers/host_cache.py): ``save(handle)`` -> a host
    # copy of a cache handle's KV (None: cannot), ``restore(state)`` -> a new handle.

    def piece(self, token: int) -> bytes:
        """The bytes of one token (for incremental detokenization)."""

    def is_eog(self, token: int) -> bool: ...


class Backend(EngineBackend, Protocol):
    """A worker process's backend: the engine's, and what its Ready tells the router."""

    weights_digest: str  # common.gguf_file.weights_digest of the served weights ("" unknown)
    tokenizer_spec: TokenizerSpec


class Engine:
    def __init__(
        self,
        backend: EngineBackend,
        config: EngineConfig,
        emit: Callable[[p.Message], None],
        worker_id: str,
        inbox: Inbox | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.backend = backend
        self.cfg = config
        self.emit = emit
        self.worker_id = worker_id
        self.clock = clock  # the twin (twin/) drives the engine on a virtual clock
        self.inbox: Inbox = inbox if inbox is not None else queue.Queue()
        self.queue: deque[Request] = deque()
        self.active: list[Request] = []
        self.cache = make_cache(backend, config)
        self._changed = True
        self._hb_seq = 0
        self._last_sent_hb: p.Heartbeat | None = None
        self._last_hb = 0.0
        self._last_full = self.clock()
        self.timer = StepTimer(config.steps_every_s, config.full_resync_s, self.clock)

    # ------------------------------------------------------------ the loop
    def run(self, stop: threading.Event) -> None:
        """Drain the inbox (blocking only when idle), step, report; until ``stop``."""
        while not stop.is_set():
            idle = not (self.queue or self.active)
            if idle:  # e.g. a cancel emptied it: the open step ends before the wait
                self.timer.stop()
            self.drain_inbox(block=idle)
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
        plan = plan_step(self.active, self.cfg.step_tokens, self._chunk_cap())
        if not plan:
            return
        decode, prefill = plan.decode, plan.prefill
        self.timer.start(len(decode), decode_context(decode), sum(n for _, n in prefill))
        sampled = self._run(decode, prefill)
        if sampled is None:
            self.timer.discard()
            return
        if isinstance(sampled, KVFull):  # part of the step ran: only that part advances
            self.timer.discard()
            decode = [r for r in decode if r.id in sampled.ran]
            prefill = [(r, n) for r, n in prefill if r.id in sampled.ran]
            sampled = sampled.tokens
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
        if not (self.queue or self.active):  # idle next: the step ends here
            self.timer.stop()

    def _chunk_cap(self) -> int | None:
        """Prompt tokens a step beside the current decode rows may take (the time
        budget, ``EngineConfig.step_budget_x``); None: no decode rows or no budget."""
        batch = sum(1 for r in self.active if r.decoding)
        if batch == 0 or not self.cfg.step_budget_x:
            return None
        c = self.cfg
        floor = max(c.min_chunk_tokens, getattr(self.backend, "min_chunk_tokens", 1))
        return self.timer.chunk_cap(batch, c.step_budget_x, c.step_tokens, floor)

    # ------------------------------------------------------------ messages
    def handle(self, msg: p.Message) -> None:
        if isinstance(msg, p.Assign):
            self.submit(Request.from_assign(msg))
        elif isinstance(msg, p.Cancel):
            self.cancel(msg.request_id)
        elif isinstance(msg, p.ResyncCache):  # also queued on every Welcome
            self.cache.request_full()
            self.timer.forget_sent()  # a new router knows no step model yet
            self._changed = True
        elif isinstance(msg, p.Reregister):
            self.drop_all()
        else:
            log.warning("engine ignores %s", msg.TYPE)

    def submit(self, req: Request) -> None:
        problem = self._check(req)
        if problem:
            self.emit(p.Error(problem.code, problem.message, req.id))
            return
        req.t_arrive = self.clock()
        # A migrated stream: replay the text already sent so that held-back stop-string
        # prefixes and split UTF-8 characters continue exactly where they were.
        for token in req.prompt[len(req.prompt) - req.resumed :]:
            req.text.feed(self.backend.piece(token))
        self.queue.append(req)
        self._changed = True

    def drop_all(self) -> None:
        """Forget every request without a word: a new registration with the router
        began, and the router has already failed or re-routed all of them."""
        if self.queue or self.active:
            log.warning("dropping %d requests of an earlier registration",
                        len(self.queue) + len(self.active))  # fmt: skip
        self.queue.clear()
        for r in list(self.active):
            self.finish(r, None, notify=False)

    def cancel(self, request_id: str) -> None:
        for r in self.queue:
            if r.id == request_id:
                self.queue.remove(r)
                r.t_done = self.clock()
                self.emit(p.Done(r.id, FinishReason.CANCELLED, self._stats(r)))
                self._changed = True
                return
        for r in self.active:
            if r.id == request_id:
                self.finish(r, FinishReason.CANCELLED)
                return
        # Unknown or already finished: cancel is idempotent.

    # ------------------------------------------------------------ bookkeeping
    def can_admit(self, req: Request) -> bool:
        reserved = sum(self._reservation(r) for r in self.active)
        return admissible(
            len(self.active),
            reserved,
            self._reservation(req),
            self.cfg.max_active,
            self.backend.n_ctx,
        )

    def admit(self) -> None:
        while self.queue and self.can_admit(self.queue[0]):
            req = self.queue[0]
            hit = self.cache.match(req.prompt)
            joined = self._join(req, hit.n_tokens)
            if joined is False:
                break  # the head waits for the prefix an active request is computing
            self.queue.popleft()
            if joined is not None:
                hit = joined
            elif hit.entry is not None:
                self.cache.pin(hit.entry)
            try:
                with self.timer.per_request():
                    match = restored(self.cache, self.backend, hit)  # from host RAM, if there
                    self.backend.begin(req, match)
            finally:
                if hit.entry is not None and joined is None:
                    self.cache.unpin(hit.entry)
            req.n_cached = req.n_computed = match.n_tokens
            req.status = Status.PREFILL
            req.t_admit = self.clock()
            self.active.append(req)
            self._changed = True

    def _join(self, req: Request, cached: int) -> Match | Literal[False] | None:
        """In-flight prefix sharing: when an active request's prompt shares more of
        ``req``'s than the cache holds, ``req`` starts from that request's KV (a Match
        on its live handle) once it is computed, and waits (False) while it is being
        computed, so that a burst sharing a prefix computes it once. None: no such
        request, or a backend that cannot share a live request's KV."""
        live_handle = getattr(self.backend, "live_handle", None)
        if live_handle is None:
            return None
        lead = prefix_leader(self.active, req, cached, self.cfg.block_size)
        if lead is None:
            return None
        leader, n = lead
        if leader.n_computed < n:
            return False
        return Match(Entry(-1, [], [], live_handle(leader)), n)

    def finish(self, req: Request, reason: FinishReason | None, notify: bool = True) -> None:
        """End ``req``; ``reason`` None: it failed (an Error was sent, its KV is dropped)."""
        req.status = Status.FINISHED
        req.finish_reason = reason
        req.t_done = self.clock()
        tail = req.text.flush() if reason in (FinishReason.LENGTH, FinishReason.EOS) else ""
        if tail:
            self.emit(p.TokenDelta(req.id, [], tail))
        self.active.remove(req)
        with self.timer.per_request():
            handle = self.backend.end(req)
            if reason is None:  # failed: its KV is what we are short of (or is suspect): drop it
                to_free = [handle]
            else:
                _, to_free = self.cache.insert(req.kv_tokens(), handle)
            for h in to_free:
                self.backend.free(h)
        if notify and reason is not None:
            self.emit(p.Done(req.id, reason, self._stats(req)))
        self._changed = True

    def _run(
        self, decode: list[Request], prefill: list[tuple[Request, int]]
    ) -> dict | KVFull | None:
        """backend.run, evicting cache entries while the KV pool is full.

        None when the step could not run: then the requests it had to give up
        have already been failed (one per retry when KV is exhausted, all of the
        step's requests when the backend itself failed). A KVFull naming the part
        that ran when only part did (room is made for the next step).
        """
        while True:
            try:
                return self.backend.run(decode, prefill)
            except KVFull as full:
                if full.ran:
                    self._make_room()
                    return full
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

    def _fail(self, reqs: list[Request], code: p.ErrorCode, message: str) -> None:
        for r in reqs:
            if r.status is not Status.FINISHED:
                self.emit(p.Error(code, message, r.id))
                self.finish(r, None, notify=False)

    def _prefill_done(self, req: Request) -> None:
        if req.prefill_only:
            self.finish(req, FinishReason.PREFILL_ONLY)
            return
        req.status = Status.DECODE
        req.t_first = self.clock()

    def _on_token(self, req: Request, token: int) -> None:
        # min_tokens: a backend masks end-of-generation tokens until then; one that
        # does not still has its output continue, as with ignore_eos.
        s = req.sampling
        if self.backend.is_eog(token) and not s.ignore_eos and len(req.output) >= s.min_tokens:
            self.finish(req, FinishReason.EOS)
            return
        req.output.append(token)
        text = req.text.feed(self.backend.piece(token))
        lp, req.token_logprobs = req.token_logprobs, None
        if lp is None:
            self.emit(p.TokenDelta(req.id, [token], text))
        else:
            logprobs = [wire_logprob(token, lp, self.backend.piece)]
            self.emit(p.TokenDelta(req.id, [token], text, logprobs=logprobs))
        if req.text.stopped:
            self.finish(req, FinishReason.STOP)
        elif len(req.output) >= req.max_tokens:
            self.finish(req, FinishReason.LENGTH)

    def _check(self, req: Request) -> p.Problem | None:
        if not req.prompt:
            return p.Problem.bad_request("empty prompt")
        if any(t < 0 or t >= self.backend.vocab_size for t in req.prompt):
            return p.Problem.bad_request("token id out of the model's vocabulary")
        problem = req.sampling.over_limit(self.cfg.max_tokens_limit)  # the rest: the door
        problem = problem or sampling_problem(req, self.backend)
        if problem:
            return problem
        if self._reservation(req) > self.backend.n_ctx:
            return p.Problem(
                p.PROMPT_TOO_LONG,
                f"prompt ({len(req.prompt)}) + max_tokens ({req.max_tokens}) exceeds "
                f"the worker's context ({self.backend.n_ctx})",
            )
        if any(r.id == req.id for r in [*self.queue, *self.active]):
            return p.Problem(p.DUPLICATE_REQUEST, f"request {req.id!r} is already here")
        return None

    @staticmethod
    def _reservation(req: Request) -> int:
        return reservation(len(req.prompt), req.max_tokens, req.prefill_only)

    def _stats(self, req: Request) -> p.DoneStats:
        return p.replace(req.stats(), worker=self.worker_id)

    # ------------------------------------------------------------ heartbeats
    def maybe_heartbeat(self) -> None:
        now = self.clock()
        if now - self._last_full >= self.cfg.full_resync_s:
            self.cache.request_full()  # heals any delta the router silently lost
            self._last_full = now
        due = now - self._last_hb >= self.cfg.heartbeat_s
        if self._changed or due or self.timer.has_news():
            self.emit(self.heartbeat())
            self._last_hb = now
            self._changed = False

    def heartbeat(self) -> p.Heartbeat:
        """The worker's state; one that says nothing new keeps the last one's ``seq``,
        so an idle worker sends the same bytes every period and the router, seeing
        them, only notes that it is alive (broker/membership.py ``repeated_heartbeat``)."""
        hb = p.Heartbeat(
            worker_id=self.worker_id,
            seq=self._hb_seq,
            active=[r.summary() for r in self.active],
            queued=[r.summary() for r in self.queue],
            kv_used_tokens=sum(len(r.kv_tokens()) for r in self.active) + self.cache.tokens_held,
            kv_capacity_tokens=self.backend.n_ctx,
            cache=self.cache.report(),
            steps=self.timer.report(),
        )
        if hb != self._last_sent_hb:
            self._hb_seq += 1
            hb.seq = self._hb_seq
            self._last_sent_hb = hb
        return hb
