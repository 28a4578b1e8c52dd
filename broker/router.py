"""The router process: registry, routing, relaying. Single-threaded around one poller.

Two ROUTER sockets: clients connect to one, workers to the other. Every frame is
decoded by common.protocol; anything malformed gets an Error reply (or a log
line) and never reaches the state below.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import zmq

from tandem.broker.calibration import DECODE_ESTIMATES, Calibration
from tandem.broker.decisions import DecisionLog, decision_record
from tandem.broker.ledger import PromptBlocks, ViewCache
from tandem.broker.policies import NoCandidate, parse_policy
from tandem.broker.registry import Routed, WorkerState, ready_problem
from tandem.broker.relay import Pending, TokenOutbox
from tandem.broker.requests import ClientRequest, prompt_tokens, validate_submit
from tandem.common import protocol as p
from tandem.common.settings import Addresses
from tandem.common.tokenizer import TextTokenizer, TokenizerSpec
from tandem.common.transport import RouterSocket

log = logging.getLogger(__name__)

EXPIRE_EVERY_S = 0.1  # liveness is checked at most this often (it walks every worker)
SPEC_ASK_EVERY_S = 1.0  # a fresh router asks one worker per second for the tokenizer spec


@dataclass(frozen=True)
class RouterConfig:
    addresses: Addresses
    policy: str = "phase_cost"
    liveness_s: float = 3.0  # floor of a worker's liveness window (else 6 heartbeats)
    no_worker_wait_s: float = 30.0  # how long a request waits for a first worker
    decision_log: str | None = None
    calibrate: bool = True  # rates follow what requests take (broker/calibration.py)
    decode_estimate: str = "budget"  # "budget" | "ratio"

    def __post_init__(self) -> None:
        parse_policy(self.policy)  # raises ValueError on an unknown policy
        if self.decode_estimate not in DECODE_ESTIMATES:
            raise ValueError(f"decode_estimate must be one of {DECODE_ESTIMATES}")
        if self.liveness_s <= 0 or self.no_worker_wait_s < 0:
            raise ValueError("liveness_s must be > 0 and no_worker_wait_s >= 0")


@dataclass
class Router:
    cfg: RouterConfig
    workers: dict[str, WorkerState] = field(default_factory=dict)
    requests: dict[str, ClientRequest] = field(default_factory=dict)  # by worker-side id
    pending: deque[ClientRequest] = field(default_factory=deque)  # waiting for any worker
    tokenizer: TextTokenizer | None = None
    model: str | None = None

    def __post_init__(self) -> None:
        self.policy = parse_policy(self.cfg.policy)
        self.client_sock = RouterSocket(self.cfg.addresses.client)
        self.worker_sock = RouterSocket(self.cfg.addresses.worker)
        self.decisions = DecisionLog(self.cfg.decision_log) if self.cfg.decision_log else None
        self.calibration = Calibration(self.cfg.calibrate, self.cfg.decode_estimate)
        self.views = ViewCache(self.calibration)
        self.outbox = TokenOutbox()
        self.tokenizer_hash = ""
        self._spec_asked_at = -SPEC_ASK_EVERY_S
        self._by_client: dict[tuple[bytes, str], str] = {}
        self._by_identity: dict[bytes, str] = {}  # worker socket identity -> worker id
        self._next_id = 0

    # ------------------------------------------------------------ loop
    def serve(self, stop: threading.Event) -> None:
        poller = zmq.Poller()
        poller.register(self.client_sock.sock, zmq.POLLIN)
        poller.register(self.worker_sock.sock, zmq.POLLIN)
        log.info(
            "router: clients on %s, workers on %s, policy %s",
            self.client_sock.address,
            self.worker_sock.address,
            self.policy.name,
        )
        next_expiry, frozen_at = 0.0, -1
        try:
            while not stop.is_set():
                if len(self.workers) != frozen_at:
                    # Long-lived state (workers, their cached views) leaves the cyclic
                    # collector's reach: full collections over it, triggered by the
                    # short-lived objects of each request, cost more than a decision.
                    gc.freeze()
                    frozen_at = len(self.workers)
                events = dict(poller.poll(timeout=100))
                # Workers first: finishing requests frees capacity for new ones.
                if self.worker_sock.sock in events:
                    self._drain(self.worker_sock, self.on_worker)
                if self.client_sock.sock in events:
                    self._drain(self.client_sock, self.on_client)
                now = time.monotonic()
                if now >= next_expiry:
                    self.expire_workers()
                    next_expiry = now + EXPIRE_EVERY_S
                self.dispatch_pending()
        finally:
            self.client_sock.close()
            self.worker_sock.close()
            if self.decisions:
                self.decisions.close()

    def _drain(self, sock: RouterSocket, handler: Any, limit: int = 256) -> None:
        for _ in range(limit):
            got = sock.recv_nowait()
            if got is None:
                break
            identity, msg = got
            try:
                handler(identity, msg)
            except Exception:  # a bug must not take the router down with it
                log.exception("router failed handling %r from %r", msg, identity)
        for pending in self.outbox.take_all():  # token deltas coalesced over this drain
            self._send_tokens(pending)

    # ------------------------------------------------------------ clients
    def on_client(self, identity: bytes, msg: p.Message | p.ProtocolError) -> None:
        reply = self.client_sock.send
        if isinstance(msg, p.ProtocolError):
            log.info("rejected client frame: %s", msg.message)
            reply(identity, p.Error(msg.code, msg.message, msg.request_id))
        elif isinstance(msg, p.Hello):
            reply(identity, p.Welcome(policy=self.policy.name))
        elif isinstance(msg, p.Submit):
            self.submit(identity, msg)
        elif isinstance(msg, p.Cancel):
            self.cancel(identity, msg.request_id)
        elif isinstance(msg, p.StatusQuery):
            rows = [
                {**w.describe(), **self.calibration.describe(w.id)}
                for w in sorted(self.workers.values(), key=lambda w: w.id)
            ]
            reply(
                identity,
                p.StatusReply(self.policy.name, rows, len(self.requests), len(self.pending)),
            )
        else:
            reply(identity, p.Error(p.BAD_REQUEST, f"clients may not send {msg.TYPE!r}"))

    def submit(self, identity: bytes, msg: p.Submit) -> None:
        key = (identity, msg.request_id)
        problem = validate_submit(msg)
        if problem is None and (key in self._by_client or self._is_pending(key)):
            problem = p.Problem(
                p.DUPLICATE_REQUEST, f"request id {msg.request_id!r} is already in flight"
            )
        if problem:
            self.client_sock.send(identity, p.Error(problem.code, problem.message, msg.request_id))
            return
        req = ClientRequest(identity, msg, time.monotonic())
        req.deadline = req.received + self.cfg.no_worker_wait_s
        self.pending.append(req)
        self.dispatch_pending()

    def cancel(self, identity: bytes, request_id: str) -> None:
        wid = self._by_client.get((identity, request_id))
        if wid is None:
            for req in list(self.pending):
                if (req.client, req.submit.request_id) == (identity, request_id):
                    self.pending.remove(req)
                    self.client_sock.send(
                        identity, p.Done(request_id, p.FinishReason.CANCELLED, {})
                    )
            return  # unknown or finished: cancel is idempotent
        req = self.requests[wid]
        self.worker_sock.send(self.workers[req.worker_id].identity, p.Cancel(wid))

    def _is_pending(self, key: tuple[bytes, str]) -> bool:
        return any((r.client, r.submit.request_id) == key for r in self.pending)

    # ------------------------------------------------------------ routing
    def dispatch_pending(self) -> None:
        now = time.monotonic()
        while self.pending:
            req = self.pending[0]
            if not self.workers:
                if now < req.deadline:
                    return
                self.pending.popleft()
                self._fail(req, p.NO_WORKERS, "no worker is connected to the router")
                continue
            self.pending.popleft()
            try:
                self.route(req)
            except Exception as exc:  # a bug must cost one request an error, not a hang
                log.exception("routing %s failed", req.submit.request_id)
                self._fail(req, p.INTERNAL, f"router error: {exc}")

    def route(self, req: ClientRequest) -> None:
        sub = req.submit
        try:
            tokens = prompt_tokens(sub, self.tokenizer)
        except ValueError as exc:
            self._fail(req, p.BAD_REQUEST, str(exc))
            return
        candidates = [w for w in self.workers.values() if w.fits(len(tokens), req.budget)]
        if not candidates:
            limit = max(w.info.n_ctx for w in self.workers.values())
            self._fail(
                req,
                p.PROMPT_TOO_LONG,
                f"prompt ({len(tokens)} tokens) + max_tokens ({req.budget}) exceeds every "
                f"worker's context (largest {limit}) or max_tokens limit",
            )
            return
        rr = self.calibration.route_request(len(tokens), req.budget)
        blocks = PromptBlocks(tokens)  # hashed once per block size, not once per worker
        views = self.views.views(candidates, blocks)
        policy = parse_policy(f"forced:{sub.worker}") if sub.worker else self.policy
        try:
            decision = policy.choose(rr, views)
        except NoCandidate as exc:
            too_long = any(sub.worker in (w.id, w.info.device) for w in self.workers.values())
            code = p.PROMPT_TOO_LONG if too_long else p.NO_WORKERS
            self._fail(req, code, f"{exc} that fits this request" if too_long else str(exc))
            return
        req.policy = policy.name
        if self.decisions:
            extra = self.calibration.log_fields()
            record = decision_record(sub.request_id, policy.name, rr, views, decision, extra)
            self.decisions.write(record)
        self._assign(req, tokens, self.workers[decision.worker_id], views)

    def _assign(self, req: ClientRequest, tokens: list[int], w: WorkerState, views: list) -> None:
        sub = req.submit
        self._next_id += 1
        wid = f"{self._next_id:x}"
        cached = next(v.cached_tokens for v in views if v.id == w.id)
        assign = p.Assign(request_id=wid, tokens=tokens, sampling=sub.sampling)
        if not self.worker_sock.send(w.identity, assign):
            self._drop_worker(w, "unreachable")
            self.pending.appendleft(req)
            return
        req.wid, req.worker_id, req.t_assigned = wid, w.id, time.monotonic()
        req.prompt_tokens, req.cached_estimate = len(tokens), cached
        w.track(Routed(wid, w.id, len(tokens), req.budget, cached, sub.sampling.prefill_only))
        w.routed_total += 1
        self.requests[wid] = req
        self._by_client[(req.client, sub.request_id)] = wid
        self.client_sock.send(req.client, p.Accepted(sub.request_id, w.id, len(tokens), cached))

    # ------------------------------------------------------------ workers
    def on_worker(self, identity: bytes, msg: p.Message | p.ProtocolError) -> None:
        if isinstance(msg, p.ProtocolError):
            log.warning("rejected worker frame from %r: %s", identity, msg.message)
            self.worker_sock.send(identity, p.Error(msg.code, msg.message, msg.request_id))
            return
        if isinstance(msg, p.Ready):
            self.register(identity, msg)
            return
        w = self._worker_by_identity(identity)
        if w is None:
            if not isinstance(msg, p.Goodbye):
                self.worker_sock.send(identity, p.Reregister())
            return
        w.last_seen = time.monotonic()
        if isinstance(msg, p.Heartbeat):
            w.on_heartbeat(msg)
            self.calibration.on_heartbeat(w.id, len(msg.active))
            if not w.cache.apply(msg.cache):
                self.worker_sock.send(identity, p.ResyncCache())
        elif isinstance(msg, p.TokenDelta | p.Done | p.Error):
            self.relay(w, msg)
        elif isinstance(msg, p.Goodbye):
            self._drop_worker(w, "said goodbye")
        else:
            log.warning("worker %s sent unexpected %s", w.id, msg.TYPE)

    def register(self, identity: bytes, ready: p.Ready) -> None:
        if self.tokenizer is None and not ready.tokenizer and ready.tokenizer_hash:
            # Ask one worker at a time for the spec; the others' Readies go unanswered
            # and come back (workers retry until welcomed), by then hash-only suffices.
            now = time.monotonic()
            if now - self._spec_asked_at >= SPEC_ASK_EVERY_S:
                self._spec_asked_at = now
                self.worker_sock.send(identity, p.Reregister(tokenizer=True))
            return
        problem = ready_problem(ready, self.model, have_tokenizer=self.tokenizer is not None)
        if problem:
            log.error("refusing worker %s: %s", ready.worker_id, problem.message)
            self.worker_sock.send(identity, p.Error(problem.code, problem.message))
            return
        if self.tokenizer is None:
            self.tokenizer = TextTokenizer(TokenizerSpec.from_wire(ready.tokenizer))
            self.tokenizer_hash = ready.tokenizer_hash or p.tokenizer_hash(ready.tokenizer)
            self.model = ready.model
        elif ready.tokenizer_hash and ready.tokenizer_hash != self.tokenizer_hash:
            log.warning("worker %s names another tokenizer than the router's (same model %s)",
                        ready.worker_id, ready.model)  # fmt: skip
        # One tokenizer spec per router, not one per worker (1.5 MB each for SmolLM2).
        ready = dataclasses.replace(ready, tokenizer={})
        old = self.workers.get(ready.worker_id)
        if old is not None and old.identity == identity and old.info == ready:
            self.worker_sock.send(identity, p.Welcome(policy=self.policy.name))
            return  # a repeated Ready (our Welcome crossed it)
        if old is not None:
            self._drop_worker(old, "re-registered")
        self.workers[ready.worker_id] = WorkerState(identity, ready)
        self._by_identity[identity] = ready.worker_id
        self.calibration.register(ready.worker_id, ready.prefill_tok_s, ready.decode_tok_s)
        log.info(
            "worker %s joined: %s on %s, max_active %d",
            ready.worker_id,
            ready.backend,
            ready.device,
            ready.max_active,
        )
        self.worker_sock.send(identity, p.Welcome(policy=self.policy.name))
        self.dispatch_pending()

    def relay(self, w: WorkerState, msg: p.TokenDelta | p.Done | p.Error) -> None:
        wid = msg.request_id
        req = self.requests.get(wid) if wid else None
        if req is None:
            if isinstance(msg, p.Error):
                log.warning("worker %s error: %s %s", w.id, msg.code, msg.message)
            return  # e.g. a late token after a cancel: nothing to relay to
        sub = req.submit
        if isinstance(msg, p.TokenDelta):
            req.on_tokens(msg, time.monotonic())
            routed = w.inflight.get(wid)
            if routed is not None:
                sample = routed.relayed(len(msg.token_ids))
                w.progressed(wid)
                if sample:
                    self.calibration.on_progress(w.id, routed.tokens_seen, req.t_first)
            if sub.stream:  # sent at the end of this drain, with any others of this request
                self.outbox.add(w, req, msg.token_ids, msg.text)
            return
        self._forget(w, req)
        if isinstance(msg, p.Done):
            self.calibration.on_done(w.id, msg.stats, msg.finish_reason, req.budget, req.t_first)
            if not sub.stream and req.buffer_ids:
                self.client_sock.send(
                    req.client,
                    p.TokenDelta(sub.request_id, req.buffer_ids, "".join(req.buffer_text)),
                )
            stats = req.final_stats(msg.stats, time.monotonic(), req.policy)
            self.client_sock.send(req.client, p.Done(sub.request_id, msg.finish_reason, stats))
        else:
            self.client_sock.send(req.client, p.Error(msg.code, msg.message, sub.request_id))

    def _send_tokens(self, pending: Pending) -> None:
        req, w = pending.req, pending.worker
        delta = p.TokenDelta(req.submit.request_id, pending.token_ids, pending.text)
        if not self.client_sock.send(req.client, delta):
            # The client is gone (or not reading): stop spending the worker on it.
            self.worker_sock.send(w.identity, p.Cancel(req.wid or ""))
            self._forget(w, req)

    def expire_workers(self) -> None:
        now = time.monotonic()
        for w in list(self.workers.values()):
            if now - w.last_seen > w.liveness_s(self.cfg.liveness_s):
                self._drop_worker(w, f"silent for {now - w.last_seen:.1f}s")

    def _drop_worker(self, w: WorkerState, why: str) -> None:
        log.warning("worker %s removed: %s", w.id, why)
        self.workers.pop(w.id, None)
        self.views.forget(w.id)
        if self._by_identity.get(w.identity) == w.id:
            del self._by_identity[w.identity]
        self.calibration.forget(w.id)
        now, again = time.monotonic(), []
        for wid in list(w.inflight):
            req = self.requests.get(wid)
            if req is None:
                continue
            self._forget(w, req)
            if req.can_reroute():  # nothing reached the client yet: route it again
                req.reroute(w.id, now, self.cfg.no_worker_wait_s)
                again.append(req)
            else:
                self._fail(req, p.WORKER_LOST, f"worker {w.id} was lost ({why})")
        self.pending.extendleft(reversed(again))  # ahead of newer requests, in their order

    def _forget(self, w: WorkerState, req: ClientRequest) -> None:
        pending = self.outbox.pop(req.wid or "")
        if pending is not None:  # its tokens go out before whatever ends the request
            self.client_sock.send(req.client, p.TokenDelta(
                req.submit.request_id, pending.token_ids, pending.text))  # fmt: skip
        w.untrack(req.wid or "")
        self.requests.pop(req.wid or "", None)
        self._by_client.pop((req.client, req.submit.request_id), None)

    def _fail(self, req: ClientRequest, code: str, message: str) -> None:
        self.client_sock.send(req.client, p.Error(code, message, req.submit.request_id))

    def _worker_by_identity(self, identity: bytes) -> WorkerState | None:
        wid = self._by_identity.get(identity)
        return self.workers.get(wid) if wid is not None else None
