"""The router's decision path on a virtual clock: the broker's own parts, no sockets.

Registration, the ledger (``broker.registry.Routed`` / ``WorkerState.view``),
cache views (``common.blocks.CacheView`` fed by the workers' heartbeats),
calibration (``broker.calibration``), the policies and the decision records are
the live router's objects; only the plumbing of broker/router.py (sockets,
client bookkeeping, retries) is replaced by direct calls that carry the virtual
time. What the client would have seen of each request is kept as a bench
``RequestRecord``, so the bench's statistics, reports and plots apply as is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tandem.bench.driver import RequestRecord
from tandem.broker.arrivals import ArrivalLog
from tandem.broker.calibration import Calibration
from tandem.broker.decisions import decision_record
from tandem.broker.policies import parse_policy
from tandem.broker.registry import Routed, WorkerState
from tandem.common import protocol as p

Send = Callable[[str, p.Message, float], None]  # (worker id, message, time)


class TwinRouter:
    """Routes whole requests to twin workers with a policy, as the live router does."""

    def __init__(
        self, policy: str, send: Send, calibrate: bool = True, decode_estimate: str = "budget"
    ) -> None:
        self.policy = parse_policy(policy)
        self.send = send
        self.calibration = Calibration(calibrate, decode_estimate)
        self.workers: dict[str, WorkerState] = {}
        self.records: dict[str, RequestRecord] = {}  # by worker-side id
        self.decisions: list[dict[str, Any]] = []
        self.arrivals = ArrivalLog()
        self.ended = 0  # requests that ended (done or failed): the replay's stop condition
        self._next_id = 0

    def register(self, ready: p.Ready) -> None:
        self.workers[ready.worker_id] = WorkerState(ready.worker_id.encode(), ready)

    def submit(
        self, rec: RequestRecord, tokens: list[int], max_tokens: int, now: float, **kw: Any
    ) -> None:
        """Route one request at ``now`` (``worker=`` pins it, ``prefill_only=`` seeds)."""
        rec.submit_s = now
        prefill_only = bool(kw.get("prefill_only", False))
        budget = 0 if prefill_only else max_tokens
        pinned = kw.get("worker")
        # Noted as it arrives, as the live router notes a Submit (before it is routed).
        before = () if pinned or prefill_only else self.arrivals.note(now)
        candidates = [w for w in self.workers.values() if w.fits(len(tokens), budget)]
        if not candidates:
            rec.error, rec.done_s = "no worker fits the request", now
            self.ended += 1
            return
        rr = self.calibration.route_request(len(tokens), budget, before)
        hashes: dict[int, list[int]] = {}  # the prompt hashed once for every candidate
        live = self.calibration.calibrate  # priced with the live step models, as the router
        views = [self.calibration.adjust(w.view(tokens, live, hashes)) for w in candidates]
        policy = parse_policy(f"forced:{pinned}") if pinned else self.policy
        decision = policy.choose(rr, views)
        if not pinned:
            record = decision_record(rec.request_id, policy.name, rr, views, decision)
            self.decisions.append(record | {"time": now})
        w = self.workers[decision.worker_id]
        cached = next(v.cached_tokens for v in views if v.id == w.id)
        self._next_id += 1
        wid = f"{self._next_id:x}"
        blocks = hashes.get(w.info.block_size, ())
        w.track(Routed(wid, w.id, len(tokens), budget, cached, prefill_only, 0, blocks))
        w.routed_total += 1
        rec.worker = w.id
        rec.stats = {"policy": policy.name, "router_cached_estimate": cached}
        self.records[wid] = rec
        sampling = p.SamplingParams(max_tokens, ignore_eos=True, prefill_only=prefill_only)
        assign = p.Assign(request_id=wid, tokens=tokens, sampling=sampling)
        self.send(w.id, assign, now)

    def on_worker(self, worker_id: str, msg: p.Message, now: float) -> None:
        """A message a twin worker emitted, delivered at ``now``."""
        w = self.workers[worker_id]
        w.last_seen = now
        if isinstance(msg, p.Heartbeat):
            w.on_heartbeat(msg)
            if msg.steps is not None:
                w.update_steps(msg.steps)
            if not w.cache.apply(msg.cache, now):
                self.send(w.id, p.ResyncCache(), now)
        elif isinstance(msg, p.TokenDelta):
            self._tokens(w, msg, now)
        elif isinstance(msg, p.Done | p.Error):
            self._end(w, msg, now)

    def _tokens(self, w: WorkerState, msg: p.TokenDelta, now: float) -> None:
        rec = self.records.get(msg.request_id or "")
        if rec is None or not msg.token_ids:
            return
        rec.token_s.extend([now] * len(msg.token_ids))
        routed = w.inflight.get(msg.request_id or "")
        if routed is not None:
            routed.tokens_seen += len(msg.token_ids)
            w.track(routed)  # its decode budget shrank

    def _end(self, w: WorkerState, msg: p.Done | p.Error, now: float) -> None:
        wid = msg.request_id or ""
        rec = self.records.pop(wid, None)
        routed = w.inflight.get(wid)
        if rec is None or routed is None:
            return
        if isinstance(msg, p.Done):
            w.finished(wid, now)
        w.untrack(wid)
        rec.done_s = now
        self.ended += 1
        if isinstance(msg, p.Error):
            rec.error = f"{msg.code}: {msg.message}"
            return
        self.calibration.on_done(msg.stats, msg.finish_reason, routed.max_tokens)
        rec.finish_reason = msg.finish_reason
        rec.output_tokens = len(rec.token_s)
        # The twin routes instantly, so the client's queue time is the worker's.
        rec.stats |= dict(msg.stats) | {"queue_s": float(msg.stats.get("worker_queue_s", 0.0))}
