"""The router process: registry, routing, relaying. Single-threaded around one poller.

Two ROUTER sockets: clients connect to one, workers to the other. Every frame is
decoded by common.protocol; anything malformed gets an Error reply (or a log
line) and never reaches the state below. What the router owes clients (and
workers their Assigns) is queued and sent at the end of each phase of a turn,
one frame per peer (``_flush``): its cost is per frame.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import zmq

from tandem.broker.admission import WORKER_FRAME_BYTES, Admission, prompt_units
from tandem.broker.arrivals import ArrivalLog
from tandem.broker.calibration import Calibration
from tandem.broker.config import RouterConfig
from tandem.broker.decisions import DecisionLog, decision_record
from tandem.broker.identity import RequestIds, foreign_frame, takeover_problem
from tandem.broker.ledger import PromptBlocks, ViewCache
from tandem.broker.liveness import Liveness, disconnect_monitor
from tandem.broker.metrics import RouterMetrics
from tandem.broker.policies import Decision, Forced, NoCandidate, RouteRequest, parse_policy
from tandem.broker.registry import Claims, Routed, WorkerState, ready_problem
from tandem.broker.relay import Pending, TokenOutbox
from tandem.broker.requests import ClientRequest, PendingQueue, prompt_tokens, validate_submit
from tandem.broker.spin import AdaptiveSpin
from tandem.broker.tokenize import Tokenizing
from tandem.common import auth
from tandem.common import protocol as p
from tandem.common.refusals import RefusalLog
from tandem.common.tokenizer import TextTokenizer, TokenizerSpec
from tandem.common.transport import RouterSocket, close_monitor, drain_events

log = logging.getLogger(__name__)

EXPIRE_EVERY_S = 0.1  # liveness is checked at most this often (it walks every worker)
# With nothing in flight, worker frames (heartbeats, mostly repeats) wait this long to
# be read together; a client still wakes the router at once, and its first turn reads
# every waiting worker frame before it routes. 256 idle workers: 4.3-4.5 % of a core at
# 20 ms, 2.9-3.1 % at 100, 2.7 % at 200 (docs/results/router-overhead.md).
IDLE_GATHER_MS = 200
SPEC_ASK_EVERY_S = 1.0
# Client bytes read per turn: decoding a 1 MiB Submit takes ~1.5 ms, and 16 of them
# read in one turn held every stream's tokens for ~25 ms (docs/results/reliability.md).
CLIENT_TURN_BYTES = 1 << 20  # a fresh router asks one worker per second for the tokenizer spec


@dataclass
class Router:
    cfg: RouterConfig
    workers: dict[str, WorkerState] = field(default_factory=dict)
    requests: dict[str, ClientRequest] = field(default_factory=dict)  # by worker-side id
    pending: PendingQueue = field(
        default_factory=lambda: PendingQueue(prompt_units)
    )  # for any worker
    tokenizer: TextTokenizer | None = None
    model: str | None = None
    weights: str = ""  # the first worker's weights digest ("" unknown)

    def __post_init__(self) -> None:
        self.policy = parse_policy(self.cfg.policy)
        adm = self.cfg.admission
        self.guard = auth.RouterGuard.start(self.cfg.keys, self.cfg.addresses)
        self.client_sock = RouterSocket(
            self.cfg.addresses.client, adm.max_frame_bytes, self.guard.setup("clients")
        )
        self.worker_sock = RouterSocket(
            self.cfg.addresses.worker, WORKER_FRAME_BYTES, self.guard.setup("workers")
        )
        self.admission = Admission(adm)
        self.liveness = Liveness(self.cfg.no_progress_s)
        self.ids = RequestIds()
        self._monitor = disconnect_monitor(self.worker_sock.sock)
        self.decisions = DecisionLog(self.cfg.decision_log) if self.cfg.decision_log else None
        self.calibration = Calibration(self.cfg.calibrate, self.cfg.decode_estimate)
        self.arrivals = ArrivalLog()  # client requests' arrival times (broker/arrivals.py)
        self.metrics = RouterMetrics(
            lambda: (len(self.workers), len(self.requests), len(self.pending))
        )
        self.views = ViewCache(self.calibration)
        self.outbox = TokenOutbox()
        self.refusals = RefusalLog(log)  # refused frames and handling failures, rate-limited
        self.tokenizing = Tokenizing()  # large prompts, tokenized off the loop
        self.spin = AdaptiveSpin(self.cfg.spin_us / 1e6)
        self.tokenizer_hash = ""
        self._spec_asked_at = -SPEC_ASK_EVERY_S
        self._by_client: dict[tuple[bytes, str], str] = {}
        self._by_identity: dict[bytes, str] = {}  # worker socket identity -> worker id
        self._claims = Claims()  # Readies for a worker id another connection holds
        self._hb_frames: dict[bytes, bytes] = {}  # identity -> its last heartbeat's bytes
        # Accepteds held until their request's first output or their time (oldest first).
        self._accepts: dict[str, tuple[ClientRequest, p.Accepted, float]] = {}
        # Metrics hooks run after the frames they count have left (_flush): at low load
        # they took ~45 us per request on the way to the worker and back to the client.
        self._settle: list[tuple[Any, tuple[Any, ...]]] = []
        self._expiry_at = 0.0  # monotonic time of the next liveness walk

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
        poller.register(self._monitor, zmq.POLLIN)
        poller.register(self.tokenizing.fd, zmq.POLLIN)
        client_wake = zmq.Poller()
        client_wake.register(self.client_sock.sock, zmq.POLLIN)
        more, frozen_at = False, -1
        ready: dict[Any, int] | None  # the sockets a poll found readable (None: read all)
        try:
            while not stop.is_set():
                if len(self.workers) != frozen_at:
                    # Long-lived state (workers, their cached views) leaves the cyclic
                    # collector's reach: full collections over it, triggered by the
                    # short-lived objects of each request, cost more than a decision.
                    gc.freeze()
                    frozen_at = len(self.workers)
                ready = dict(poller.poll(timeout=0)) if more else self._wait(poller)
                idle = not (more or self.requests or self.pending or self.tokenizing)
                if idle and self.client_sock.sock not in ready:
                    # Idle, woken by heartbeats: let them gather for a moment, waking
                    # at once for a client: one turn then handles many, and the
                    # per-turn and cold-cache costs are shared. (A client already
                    # waiting is served now: reading every socket again, and a second
                    # poll, cost a lone request ~15 us.)
                    client_wake.poll(timeout=IDLE_GATHER_MS)
                    ready = None  # anything may have come meanwhile
                start = time.monotonic()
                more = self.turn(None if more else ready)
                self.liveness.turn_took(start, time.monotonic())
        finally:
            close_monitor(self.worker_sock.sock, self._monitor)
            self.client_sock.close()
            self.worker_sock.close()
            self.guard.stop()
            self.tokenizing.close()
            if self.decisions:
                self.decisions.close()

    def _wait(self, poller: zmq.Poller) -> dict[Any, int]:
        """The sockets with input: polled without sleeping for the spin window
        (broker/spin.py), then waited for until ``_poll_ms``."""
        start = time.monotonic()
        window = self.spin.window_s
        if window:  # no longer than a held Accepted may wait (_poll_ms)
            deadline = start + min(window, self._poll_ms() / 1e3)
            while True:
                ready = dict(poller.poll(timeout=0))
                if ready:
                    traffic = self._traffic(ready)
                    self.spin.waited(time.monotonic() - start, caught=traffic)
                    return ready
                if time.monotonic() >= deadline:
                    break
        ready = dict(poller.poll(timeout=self._poll_ms()))
        elapsed = time.monotonic() - start if self._traffic(ready) else math.inf
        self.spin.waited(elapsed, caught=False)
        return ready

    def _traffic(self, ready: dict[Any, int]) -> bool:
        """Whether input that ended a wait is traffic, which keeps or earns polling: a
        client's frame, or any while requests are out (an idle router's heartbeats
        gather for 200 ms instead: serve)."""
        return bool(self.requests) or self.client_sock.sock in ready

    def turn(self, ready: dict[Any, int] | None = None) -> bool:
        """One bounded slice of work; True when client work was left for the next turn.

        Worker frames are read in full before anything is expired, client work is
        bounded per turn (broker/admission.py), so heartbeats are never starved.
        ``ready``: the sockets a poll found readable; the others are not read this
        turn (an empty read costs ~20 us at low load). None: read every one.
        """
        now = time.monotonic()
        if (ready is None or self._monitor in ready) and drain_events(self._monitor):
            self.liveness.on_disconnect(now)
        if self.liveness.probe_due(now):
            self._probe_workers()
        # Workers first: finishing requests frees capacity for new ones.
        skip = ready is not None and self.worker_sock.sock not in ready
        if (skip or self.drain_workers()) and now >= self._expiry_at:
            self.expire_workers()  # it walks every worker: not more often than EXPIRE_EVERY_S
            self._expiry_at = now + EXPIRE_EVERY_S
        self._flush()  # whatever expiring workers failed
        if self.tokenizing and (ready is None or self.tokenizing.fd in ready):
            self._tokenized()
        adm = self.cfg.admission
        more = False
        if ready is None or self.client_sock.sock in ready:
            frames, size = adm.client_frames_per_turn, CLIENT_TURN_BYTES
            more = not self._drain(self.client_sock, self.on_client, frames, None, size)
        return self.dispatch_pending(limit=adm.routes_per_turn) or more

    def drain_workers(self) -> bool:
        """Every waiting worker frame (repeated heartbeats noted, not decoded);
        True when the socket was emptied."""
        return self._drain(self.worker_sock, self.on_worker, 100_000, self._same_heartbeat)

    def _drain(
        self,
        sock: RouterSocket,
        handler: Any,
        limit: int = 256,
        repeat: Any = None,
        max_bytes: int = 1 << 62,
    ) -> bool:
        """Handle up to ``limit`` waiting frames (or until ``max_bytes`` are read);
        True when the socket was emptied. ``repeat(identity, frame)``: True when the
        frame repeats one already handled (then it is not decoded again)."""
        emptied, size = False, 0
        for _ in range(limit):
            parts = sock.recv_frames_nowait()
            if parts is None:
                emptied = True
                break
            # Nothing a peer sends may raise out of a turn: parse (which refuses any
            # bad frame as a ProtocolError, common/protocol.decode) and handling both
            # stand inside this one boundary.
            try:
                if repeat is not None and len(parts) == 2 and repeat(parts[0], parts[1]):
                    continue
                identity, msg = sock.parse(parts)
                handler(identity, msg)
                if (
                    repeat is not None
                    and isinstance(msg, p.Heartbeat)
                    and identity in self._by_identity
                ):
                    self._hb_frames[identity] = parts[1]
            except Exception:  # a bug must not take the router down with it
                self.refusals.note("router failed handling a frame from %r", parts[0],
                                   exc_info=True)  # fmt: skip
            size += len(parts[-1])
            if size >= max_bytes:
                break
            if not sock.waiting():  # cheaper than the read that would find nothing
                emptied = True
                break
        for pending in self.outbox.take_all():  # token deltas coalesced over this drain
            self._send_tokens(pending)
        self._flush()
        return emptied or not sock.waiting()

    def _flush(self) -> None:
        """Send what the router owes its peers, one frame each (common/transport.py):
        workers first, so that a request whose Assign did not leave is queued again
        before its client is told it was accepted."""
        if self.worker_sock.held:  # most calls find nothing queued: no call then
            for identity, lost in self.worker_sock.flush():
                self._assigns_lost(identity, lost)
        if self._accepts:
            self._release_accepts(time.monotonic())
        if self.client_sock.held:
            for identity, lost in self.client_sock.flush():
                self._client_gone(identity, lost)
        if self._settle:
            settle, self._settle = self._settle, []
            for hook, args in settle:
                hook(*args)

    def _same_heartbeat(self, identity: bytes, frame: bytes) -> bool:
        """A registered worker's heartbeat, byte for byte its last one (an idle worker
        repeats its seq when nothing changed, workers/engine.py): it is alive and has
        nothing new, so only liveness is noted. Most heartbeats of idle workers."""
        last = self._hb_frames.get(identity)
        if last is None or frame != last:
            return False
        w = self._worker_by_identity(identity)
        if w is None or w.heartbeat is None:
            del self._hb_frames[identity]
            return False
        w.last_seen = now = time.monotonic()
        self._note_progress(w, w.heartbeat, now)
        w.cache.expire(now)  # noted blocks run out on time, reported or not
        return True

    def _note_progress(self, w: WorkerState, hb: p.Heartbeat, now: float) -> None:
        """Liveness learns the work ``hb`` lists (stuck workers list the same)."""
        remaining = sum(r.prefill_remaining + r.decode_remaining for r in hb.active + hb.queued)
        self.liveness.on_heartbeat(w.id, remaining, bool(w.inflight), now)

    # ------------------------------------------------------------ clients
    def on_client(self, identity: bytes, msg: p.Message | p.ProtocolError) -> None:
        reply = self.client_sock.queue
        if isinstance(msg, p.ProtocolError):
            self.refusals.refused(msg.reason, "rejected client frame (%s): %s", msg.reason,
                                  msg.message)  # fmt: skip
            self.metrics.on_rejected("client", msg.reason)
            reply(identity, p.Error(msg.code, msg.message, msg.request_id))
        elif isinstance(msg, p.Hello):
            reply(identity, self._welcome())
        elif isinstance(msg, p.Submit):
            self.submit(identity, msg)
        elif isinstance(msg, p.Cancel):
            self.cancel(identity, msg.request_id)
        elif isinstance(msg, p.StatusQuery):
            live = self.cfg.calibrate
            rows = [w.describe(live) for w in sorted(self.workers.values(), key=lambda w: w.id)]
            reply(
                identity,
                p.StatusReply(
                    self.policy.name,
                    rows,
                    len(self.requests),
                    len(self.pending),
                    self.metrics.activity(),
                ),
            )
        else:
            reply(identity, p.Error(p.BAD_REQUEST, f"clients may not send {msg.TYPE!r}"))

    def submit(self, identity: bytes, msg: p.Submit) -> None:
        key = (identity, msg.request_id)
        problem = validate_submit(msg) or self.admission.prompt_problem(msg)
        if problem is None and (
            key in self._by_client or key in self.pending or key in self.tokenizing
        ):
            problem = p.Problem(
                p.DUPLICATE_REQUEST, f"request id {msg.request_id!r} is already in flight"
            )
        if problem is None:  # prompts being tokenized wait as the pending ones do
            units = prompt_units(msg) + self.pending.units + self.tokenizing.units
            problem = self.admission.full_problem(len(self.pending) + len(self.tokenizing), units)
        if problem:
            self.client_sock.queue(identity, self.admission.error(problem, msg, len(self.pending)))
            return
        req = ClientRequest(identity, msg, time.monotonic())
        req.deadline = req.received + self.cfg.no_worker_wait_s
        if not (msg.worker or msg.sampling.prefill_only):  # traffic, not a pin or a seed
            req.earlier_arrivals = self.arrivals.record(req.received)
        self.pending.append(req)  # routed by the loop, a bounded number per turn

    def cancel(self, identity: bytes, request_id: str) -> None:
        wid = self._by_client.get((identity, request_id))
        if wid is None:
            req = self.tokenizing.cancel((identity, request_id))
            if req is not None:  # its tokens, when they come, are dropped
                done = p.Done(request_id, p.FinishReason.CANCELLED, {})
                self.client_sock.queue(identity, done)
                self.metrics.on_outcome(req.policy, "cancelled")
                return
            for req in list(self.pending):
                if (req.client, req.submit.request_id) == (identity, request_id):
                    self.pending.remove(req)
                    done = p.Done(request_id, p.FinishReason.CANCELLED, {})
                    self.client_sock.queue(identity, done)
                    self.metrics.on_outcome(req.policy, "cancelled")
            return  # unknown or finished: cancel is idempotent
        req = self.requests[wid]
        self.worker_sock.send(self.workers[req.worker_id].identity, p.Cancel(wid))

    # ------------------------------------------------------------ routing
    def dispatch_pending(self, limit: int | None = None) -> bool:
        """Route waiting requests in order; True when ``limit`` routes left some behind."""
        try:
            return self._dispatch(limit)
        finally:
            self._flush()

    def _dispatch(self, limit: int | None) -> bool:
        if not self.pending:  # most turns: nothing waits, not even for a clock read
            return False
        now, routed = time.monotonic(), 0
        while self.pending:
            req = self.pending[0]
            if not self.workers:
                if now < req.deadline:
                    return False
                self.pending.popleft()
                self._fail(req, p.NO_WORKERS, "no worker is connected to the router")
                continue
            if limit is not None and routed >= limit:
                return True
            self.pending.popleft()
            routed += 1
            if self.tokenizer is not None and self.tokenizing.wants(req):
                self.tokenizing.start(req, self.tokenizer)  # back when tokenized (_tokenized)
                continue
            try:
                placed = self.route(req)
            except Exception as exc:  # a bug must cost one request an error, not a hang
                log.exception("routing %s failed", req.submit.request_id)
                self._fail(req, p.INTERNAL, f"router error: {exc}")
                continue
            if not placed:  # every worker it fits is at its in-flight cap: wait, in order
                self.pending.appendleft(req)
                return False
        return False

    def _tokenized(self) -> None:
        """Requests whose prompts were tokenized off the loop go back to the head of
        the queue (they came before the ones there), or fail as they would have."""
        back = []
        for req, tokens in self.tokenizing.finished():
            if isinstance(tokens, ValueError):
                self._fail(req, p.BAD_REQUEST, str(tokens))
            elif isinstance(tokens, BaseException):
                log.error("tokenizing %s failed: %r", req.submit.request_id, tokens)
                self._fail(req, p.INTERNAL, f"router error: {tokens}")
            else:
                req.tokens = tokens
                back.append(req)
        self.pending.extendleft(reversed(back))

    def route(self, req: ClientRequest) -> bool:
        """Assign ``req`` (or fail it); False when it must wait for room on a worker."""
        sub = req.submit
        t0 = time.perf_counter()
        if req.tokens is None:
            try:
                req.tokens = prompt_tokens(sub, self.tokenizer)
            except ValueError as exc:
                self._fail(req, p.BAD_REQUEST, str(exc))
                return True
        if req.output_ids and req.budget_left <= 0:  # migrated after its last token
            self._finish_migrated(req)
            return True
        tokens = req.tokens + req.output_ids  # a migrated stream continues after its output
        n, budget = len(tokens), req.budget_left  # once, not once per worker
        blocks = PromptBlocks(tokens)  # hashed once per block size, not once per worker
        policy = parse_policy(f"forced:{sub.worker}") if sub.worker else self.policy
        # Nothing to choose (one worker has room and it fits): nothing to score, and
        # no view of it to build (unless decisions are logged: a record shows views).
        self.views.refresh(self.workers.values())
        lone = self.views.sole(n, budget) if policy.takes_any and not self.decisions else None
        if lone is not None:
            rr, elapsed_s = self.calibration.route_request(n, budget), time.perf_counter() - t0
            decision = Decision(lone.id, {})
            self._place(req, tokens, lone, blocks, policy.name, rr, decision, 1, elapsed_s)
            return True
        # One pass: views of the workers it fits that have room (batch + queue share).
        views = self.views.offered(blocks, n, budget)
        if not views:
            if any(w.fits(n, budget) for w in self.workers.values()):
                return False  # it fits somewhere: wait for room
            limit = max((w.info.n_ctx for w in self.workers.values()), default=0)
            self._fail(
                req,
                p.PROMPT_TOO_LONG,
                f"prompt ({n} tokens) + max_tokens ({budget}) exceeds every "
                f"worker's context (largest {limit}) or max_tokens limit",
            )
            return True
        # A migrated request is not an arrival: nothing to expect from it.
        arrivals = () if req.lost_on else req.arrivals_before
        rr = self.calibration.route_request(n, budget, arrivals)
        try:
            if len(views) == 1 and policy.takes_any:  # nothing to choose: nothing to score
                decision = Decision(views[0].id, {})
            else:
                decision = policy.choose(rr, views)
        except NoCandidate as exc:
            # Pinned by the request (its policy is then forced:<worker>), or by a forced
            # router policy (`--policy forced:gpu`).
            pinned = policy.selector if isinstance(policy, Forced) else None
            fitting = [w for w in self.workers.values() if w.fits(n, budget)]
            if any(pinned in (w.id, w.info.device) for w in fitting):
                return False  # the pinned worker is full: wait for it
            too_long = any(pinned in (w.id, w.info.device) for w in self.workers.values())
            if req.lost_on and not too_long:  # pinned to the worker it lost: no migration
                lost = f"worker {req.lost_on[-1]} was lost; the request is pinned to {pinned!r}"
                self._fail(req, p.WORKER_LOST, lost)
                return True
            code = p.PROMPT_TOO_LONG if too_long else p.NO_WORKERS
            self._fail(req, code, f"{exc} that fits this request" if too_long else str(exc))
            return True
        elapsed_s = time.perf_counter() - t0  # the decision, not the writing of its record
        if self.decisions:
            extra = self.calibration.log_fields()
            record = decision_record(sub.request_id, policy.name, rr, views, decision, extra)
            self.decisions.write(record)
        w = self.workers[decision.worker_id]
        self._place(req, tokens, w, blocks, policy.name, rr, decision, len(views), elapsed_s)
        return True

    def _place(
        self,
        req: ClientRequest,
        tokens: list[int],
        w: WorkerState,
        blocks: PromptBlocks,
        policy: str,
        rr: RouteRequest,
        decision: Decision,
        candidates: int,
        elapsed_s: float,
    ) -> None:
        """``req`` goes to ``w``, chosen by ``policy`` among ``candidates`` workers in a
        decision of ``elapsed_s``; its metrics are settled later."""
        req.policy = policy
        self._assign(req, tokens, w, blocks)
        args = (req.submit.request_id, policy, rr, decision, candidates, req.cached_estimate,
                elapsed_s)  # fmt: skip
        self._settle.append((self.metrics.on_decision, args))

    def _assign(
        self, req: ClientRequest, tokens: list[int], w: WorkerState, blocks: PromptBlocks
    ) -> None:
        sub = req.submit
        wid = self.ids.next()
        cached = blocks.cached_on(w)  # as its view said (the chain is hashed as far already)
        resume = len(req.output_ids)
        # Queued: the turn's Assigns to one worker leave in one frame (_flush; one that
        # cannot leave puts its request back in the queue, _assigns_lost).
        self.worker_sock.queue(w.identity, p.Assign(wid, tokens, req.continued_sampling(), resume))
        req.wid, req.worker_id, req.t_assigned = wid, w.id, time.monotonic()
        req.prompt_tokens, req.cached_estimate = len(req.tokens or ()), cached
        prefill_only = sub.sampling.prefill_only
        # Hashed in full only if it finishes there (WorkerState.finished notes them).
        chain = blocks.chain(w.info.block_size)
        w.track(Routed(wid, w.id, len(tokens), req.budget_left, cached, prefill_only, 0, chain))
        w.routed_total += 1
        self.requests[wid] = req
        self._by_client[(req.client, sub.request_id)] = wid
        if not resume:  # a migrated stream goes on as one stream: no second Accepted
            accepted = p.Accepted(sub.request_id, w.id, len(tokens), cached)
            self._accepts[wid] = (req, accepted, time.monotonic() + self.cfg.accept_hold_ms / 1e3)

    def _release_accepts(self, now: float) -> None:
        """Accepteds whose hold is over go out alone (they are held oldest first)."""
        due = []
        for wid, (_, _, at) in self._accepts.items():
            if at > now:
                break
            due.append(wid)
        for wid in due:
            self._release_accept(wid)

    def _release_accept(self, wid: str) -> None:
        """``wid``'s Accepted, if still held, goes first in what its client gets next."""
        held = self._accepts.pop(wid, None)
        if held is not None:
            self.client_sock.queue(held[0].client, held[1])

    def _poll_ms(self) -> int:
        """How long the loop may wait for input: until the first held Accepted is due."""
        if not self._accepts:
            return 100
        first = next(iter(self._accepts.values()))[2]
        return max(0, min(100, math.ceil((first - time.monotonic()) * 1e3)))

    def _assigns_lost(self, identity: bytes, lost: list[p.Message]) -> None:
        """Assigns that could not be sent: the worker is gone; their requests wait for
        another, first in the queue, as if never assigned (no reroute counted)."""
        w, again = self._worker_by_identity(identity), []
        for msg in lost:
            req = self.requests.get(msg.request_id) if isinstance(msg, p.Assign) else None
            if req is not None and w is not None and req.worker_id == w.id:
                self._accepts.pop(msg.request_id, None)  # it was never accepted there
                self._forget(w, req)
                req.wid = req.worker_id = None
                again.append(req)
        if w is not None:
            self._drop_worker(w, "unreachable")
        self.pending.extendleft(reversed(again))

    def _client_gone(self, identity: bytes, lost: list[p.Message]) -> None:
        """Frames a client could not be sent (it left, or stopped reading): stop
        spending workers on its requests."""
        for msg in lost:
            wid = self._by_client.get((identity, getattr(msg, "request_id", None) or ""))
            req = self.requests.get(wid) if wid else None
            if req is None:
                continue
            w = self.workers.get(req.worker_id or "")
            if w is not None:
                self.worker_sock.send(w.identity, p.Cancel(wid or ""))
                self._forget(w, req)
            self.metrics.on_outcome(req.policy, "client_gone")

    # ------------------------------------------------------------ workers
    def on_worker(self, identity: bytes, msg: p.Message | p.ProtocolError) -> None:
        if isinstance(msg, p.Batch):  # what the worker's I/O thread found waiting together
            for entry in p.entries(msg):
                try:
                    self.on_worker(identity, entry)
                except Exception:  # as _drain does per frame: the other entries still count
                    self.refusals.note("router failed handling %s from %r", entry.__class__,
                                       identity, exc_info=True)  # fmt: skip
            return
        if isinstance(msg, p.ProtocolError):
            self.refusals.refused(msg.reason, "rejected worker frame from %r (%s): %s",
                                  identity, msg.reason, msg.message)  # fmt: skip
            self.metrics.on_rejected("worker", msg.reason)
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
        w.last_seen = now = time.monotonic()
        if isinstance(msg, p.Heartbeat):
            w.on_heartbeat(msg)
            self._note_progress(w, msg, now)
            problem = w.update_steps(msg.steps) if msg.steps is not None else None
            if problem:  # routing goes on with the last good model
                log.warning("worker %s sent an unusable step model: %s", w.id, problem)
            if not w.cache.apply(msg.cache, time.monotonic()):
                self.worker_sock.send(identity, p.ResyncCache())
            self.metrics.on_heartbeat(w, w.rates(self.cfg.calibrate))
        elif isinstance(msg, p.StepTokens):  # several requests' deltas in one frame
            self.relay_tokens(w, msg.request_ids, msg.token_ids, msg.texts)
        elif isinstance(msg, p.TokenDelta):
            self.relay_tokens(w, (msg.request_id,), (msg.token_ids,), (msg.text,))
        elif isinstance(msg, p.Done | p.Error):
            self.relay(w, msg)
        elif isinstance(msg, p.Goodbye):
            self._drop_worker(w, "said goodbye")
        else:
            log.warning("worker %s sent unexpected %s", w.id, msg.TYPE)

    def register(self, identity: bytes, ready: p.Ready) -> None:
        self._hb_frames.pop(identity, None)  # a new registration starts from full reports
        if self.tokenizer is None and not ready.tokenizer and ready.tokenizer_hash:
            # Ask one worker at a time for the spec; the others' Readies go unanswered
            # and come back (workers retry until welcomed), by then hash-only suffices.
            now = time.monotonic()
            if now - self._spec_asked_at >= SPEC_ASK_EVERY_S:
                self._spec_asked_at = now
                self.worker_sock.send(identity, p.Reregister(tokenizer=True))
            return
        problem = ready_problem(ready, self.model, self.tokenizer is not None, self.weights)
        if problem:
            log.error("refusing worker %s: %s", ready.worker_id, problem.message)
            self.worker_sock.send(identity, p.Error(problem.code, problem.message))
            return
        if self.tokenizer is None:
            self.tokenizer = TextTokenizer(TokenizerSpec.from_wire(ready.tokenizer))
            self.tokenizer_hash = ready.tokenizer_hash or p.tokenizer_hash(ready.tokenizer)
            self.model = ready.model
            self.weights = ready.weights
        elif ready.tokenizer_hash and ready.tokenizer_hash != self.tokenizer_hash:
            log.warning("worker %s names another tokenizer than the router's (same model %s)",
                        ready.worker_id, ready.model)  # fmt: skip
        # One tokenizer spec per router, not one per worker (1.5 MB each for SmolLM2).
        ready = dataclasses.replace(ready, tokenizer={})
        old = self.workers.get(ready.worker_id)
        if old is not None and old.identity == identity and old.info == ready:
            self.worker_sock.send(identity, self._welcome())
            return  # a repeated Ready (our Welcome crossed it)
        if old is not None:
            silent_s = self.liveness.silent_for(old.last_seen, time.monotonic())
            live = silent_s <= old.liveness_s(self.cfg.liveness_s)
            taken = takeover_problem(old.identity, identity, ready.worker_id, live)
            refused = taken and self._claims.refusal(identity, old, time.monotonic())
            if refused:  # the holder spoke since this claim began: a duplicate, told so
                log.error("refusing worker %s from %r: %s", ready.worker_id, identity,
                          refused.message)  # fmt: skip
                self.worker_sock.send(identity, p.Error(refused.code, refused.message))
                return
            if taken:  # no reply: a restarted worker retries its Ready until the id is free
                log.warning("ignoring Ready from %r: %s", identity, taken.message)
                return
        if old is not None:
            self._drop_worker(old, "re-registered")
        cap = self.cfg.admission.inflight_cap(ready.max_active)
        self.workers[ready.worker_id] = WorkerState(identity, ready, inflight_cap=cap)
        self._claims.first.pop(identity, None)
        self._by_identity[identity] = ready.worker_id
        log.info(
            "worker %s joined: %s on %s, max_active %d",
            ready.worker_id,
            ready.backend,
            ready.device,
            ready.max_active,
        )
        self.worker_sock.send(identity, self._welcome())

    def relay_tokens(
        self, w: WorkerState, wids: Sequence[str], ids: Sequence[list[int]], texts: Sequence[str]
    ) -> None:
        """Token deltas from ``w`` (entry i: ``wids[i]``'s ``ids[i]`` and ``texts[i]``),
        noted and queued for their clients without a message object per delta; what is
        per worker (liveness, the token counter) is done once per frame."""
        now, relayed, n_tokens, requests = time.monotonic(), 0, 0, self.requests
        for wid, token_ids, text in zip(wids, ids, texts, strict=True):
            req = requests.get(wid)
            if req is None:
                continue  # e.g. a late token after a cancel: nothing to relay to
            if foreign_frame(req.worker_id, w.id):
                log.warning("worker %s sent tokens for %s, assigned to %s: ignored",
                            w.id, wid, req.worker_id)  # fmt: skip
                continue
            req.on_tokens(token_ids, text, now)
            relayed, n_tokens = relayed + 1, n_tokens + len(token_ids)
            routed = w.inflight.get(wid)
            if routed is not None:
                routed.tokens_seen += len(token_ids)
                w.progressed(wid)  # its decode budget shrank: recomputed at the next view
            if req.submit.stream:  # sent at the end of this drain, with any others of it
                self.outbox.add(w, req, token_ids, text)
        if relayed:
            self.liveness.on_output(w.id, now)
            # Counted once the tokens have left (_flush), as the other metrics hooks.
            self._settle.append((self.metrics.on_tokens, (w.id, n_tokens)))

    def relay(self, w: WorkerState, msg: p.Done | p.Error) -> None:
        wid = msg.request_id
        req = self.requests.get(wid) if wid else None
        if req is not None and foreign_frame(req.worker_id, w.id):
            log.warning("worker %s sent %s for %s, assigned to %s: ignored",
                        w.id, msg.TYPE, wid, req.worker_id)  # fmt: skip
            return
        if req is None:
            if isinstance(msg, p.Error):
                log.warning("worker %s error: %s %s", w.id, msg.code, msg.message)
            return  # e.g. a late token after a cancel: nothing to relay to
        sub = req.submit
        now = time.monotonic()
        self.liveness.on_output(w.id, now)
        if isinstance(msg, p.Done):
            w.finished(wid or "", now)  # its prompt is cached there: before _forget untracks
        self._forget(w, req)
        self.admission.on_done(now)
        if isinstance(msg, p.Done):
            self.calibration.on_done(msg.stats, msg.finish_reason, req.budget)
            self._send_buffered(req)
            stats = req.final_stats(msg.stats, time.monotonic(), req.policy)
            self.client_sock.queue(req.client, p.Done(sub.request_id, msg.finish_reason, stats))
            self._settle.append((self.metrics.on_done, (req.policy, msg.finish_reason, stats)))
        else:
            self.client_sock.queue(req.client, p.Error(msg.code, msg.message, sub.request_id))
            self.metrics.on_outcome(req.policy, msg.code)

    def _send_tokens(self, pending: Pending) -> None:
        req = pending.req
        self._release_accept(req.wid or "")  # with its first tokens, in one frame
        delta = p.TokenDelta(req.submit.request_id, pending.token_ids, pending.text)
        self.client_sock.queue(req.client, delta)  # a client gone: _client_gone

    def expire_workers(self) -> None:
        now = time.monotonic()
        for w in list(self.workers.values()):
            window_s = w.liveness_s(self.cfg.liveness_s)
            why = self.liveness.why_expired(w.id, w.last_seen, window_s, bool(w.inflight), now)
            if why:
                self._drop_worker(w, why)

    def _probe_workers(self) -> None:
        """After a disconnect event: a send to a departed worker fails at once."""
        for w in list(self.workers.values()):
            if not self.worker_sock.send(w.identity, self._welcome()):
                self._drop_worker(w, "disconnected")

    def _drop_worker(self, w: WorkerState, why: str) -> None:
        log.warning("worker %s removed: %s", w.id, why)
        self.workers.pop(w.id, None)
        self._hb_frames.pop(w.identity, None)
        if self._by_identity.get(w.identity) == w.id:
            del self._by_identity[w.identity]
        self.metrics.on_worker_removed(w.id)
        self.liveness.forget(w.id)
        now, again = time.monotonic(), []
        for wid in list(w.inflight):
            req = self.requests.get(wid)
            if req is None:
                continue
            self._forget(w, req)
            self.worker_sock.send(w.identity, p.Cancel(wid))  # if it lives, stop it there
            if req.can_reroute():  # continues elsewhere after the output already relayed
                req.reroute(w.id, now, self.cfg.no_worker_wait_s)
                again.append(req)
            else:
                self._fail(req, p.WORKER_LOST, f"worker {w.id} was lost ({why})")
        self.pending.extendleft(reversed(again))  # ahead of newer requests, in their order

    def _forget(self, w: WorkerState, req: ClientRequest) -> None:
        self._release_accept(req.wid or "")  # before whatever ends (or moves) the request
        pending = self.outbox.pop(req.wid or "")
        if pending is not None:  # its tokens go out before whatever ends the request
            self._send_tokens(pending)
        w.untrack(req.wid or "")
        self.requests.pop(req.wid or "", None)
        self._by_client.pop((req.client, req.submit.request_id), None)

    def _finish_migrated(self, req: ClientRequest) -> None:
        """A request whose worker died after its last token but before its Done."""
        self._send_buffered(req)
        stats = req.final_stats({"output_tokens": 0}, time.monotonic(), req.policy)
        done = p.Done(req.submit.request_id, p.FinishReason.LENGTH, stats)
        self.client_sock.queue(req.client, done)

    def _welcome(self) -> p.Welcome:
        return p.Welcome(policy=self.policy.name, epoch=self.ids.epoch)

    def _send_buffered(self, req: ClientRequest) -> None:
        """stream=False: the whole output in one TokenDelta, just before the Done."""
        if not req.submit.stream and req.output_ids:
            text = "".join(req.buffer_text)
            delta = p.TokenDelta(req.submit.request_id, req.output_ids, text)
            self.client_sock.queue(req.client, delta)

    def _fail(self, req: ClientRequest, code: str, message: str) -> None:
        self.client_sock.queue(req.client, p.Error(code, message, req.submit.request_id))
        self.metrics.on_outcome(req.policy, code)

    def _worker_by_identity(self, identity: bytes) -> WorkerState | None:
        wid = self._by_identity.get(identity)
        return self.workers.get(wid) if wid is not None else None
