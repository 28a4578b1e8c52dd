"""The router's metrics: Prometheus series on /metrics, and the activity `tandem top` shows.

The router calls one hook per event (a decision, relayed tokens, an outcome, a
heartbeat, a worker leaving, a rejected frame); everything here is counting, so a
hook never raises into the router. Each router owns its own registry (not
prometheus-client's global one), so several routers can live in one process (tests).
Names follow the vLLM / SGLang style with a ``tandem_`` prefix; docs/METRICS.md lists
them. The HTTP endpoint runs on prometheus-client's own daemon thread: the router
thread only updates values.

The series every request moves (its outcome, route, tokens and latencies) are
``_Counter`` / ``_Histogram`` below: plain numbers that only the router thread
writes, turned into metric families when the registry is collected. Through
prometheus-client's children (a lock per value, a Python loop over the buckets
per observation) they cost a lone request several times what these do
(docs/results/router-overhead.md). The per-worker gauges, set on heartbeats, stay
prometheus-client's.
"""

from __future__ import annotations

import logging
import math
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, cast

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
)
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from tandem.broker.policies import Decision, RouteRequest
from tandem.broker.registry import WorkerState
from tandem.common import protocol as p
from tandem.common.pricing import Rates
from tandem.common.steptime import batch_ladder

log = logging.getLogger(__name__)

# Buckets in seconds. TTFT spans a warm GPU prefix hit (ms) to a cold CPU prefill
# behind a queue (minutes); end to end and queue wait reach further.
TTFT_BUCKETS_S = (0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.25, 2.5, 5, 10, 20, 40, 80)
E2E_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120, 240, 480)
DECISION_BUCKETS_S = (2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 5e-2)
RECENT_DECISIONS = 32  # how many the status reply carries for `tandem top`


class RouterMetrics:
    """Every series the router exports, plus totals and recent decisions for status."""

    def __init__(
        self,
        state: Callable[[], tuple[int, int, int]] | None = None,
        wall_clock: Callable[[], float] = lambda: 0.0,
    ) -> None:
        """``state`` returns (workers, requests in flight, requests pending); it is read
        at scrape time from the HTTP thread, so it must only take lengths. ``wall_clock``:
        the driver's calendar time (uptime, when a recent decision was made); the core
        reads no clock of its own."""
        self.wall_clock = wall_clock
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = _Counter(
            "tandem_requests",
            "Requests ended, by outcome (a finish reason or an error code) and policy.",
            ("outcome", "policy"),
            r,
        )
        self.routed = _Counter(
            "tandem_requests_routed",
            "Routing decisions, by the worker chosen and the deciding policy.",
            ("worker", "policy"),
            r,
        )
        # Beside ``routed``: a worker that is routed more than it serves is losing
        # requests (reroutes, failures); the two per worker say it in one scrape.
        self.served = _Counter(
            "tandem_requests_served",
            "Requests a worker finished, by the worker and the finish reason.",
            ("worker", "outcome"),
            r,
        )
        self.prompt_tokens = _Counter(
            "tandem_prompt_tokens", "Prompt tokens of finished requests.", ("worker",), r
        )
        self.cached_tokens = _Counter(
            "tandem_cached_prompt_tokens",
            "Prompt tokens a worker reused from its prefix cache.",
            ("worker",),
            r,
        )
        self.generation_tokens = _Counter(
            "tandem_generation_tokens", "Output tokens relayed from workers.", ("worker",), r
        )
        self.rejected = Counter(
            "tandem_frames_rejected",
            "Frames refused at the protocol boundary, by sender side and reason.",
            ["source", "reason"],
            registry=r,
        )
        self.connections_refused = Counter(
            "tandem_connections_refused",
            "Connections refused at the handshake: their address already held the most "
            "connections one address may on that socket (workers or clients).",
            ["socket"],
            registry=r,
        )
        self.ttft = _Histogram(
            "tandem_time_to_first_token_seconds",
            "Submit received to first token relayed.",
            ("worker",),
            TTFT_BUCKETS_S,
            r,
        )
        self.e2e = _Histogram(
            "tandem_e2e_request_latency_seconds",
            "Submit received to done relayed.",
            ("worker",),
            E2E_BUCKETS_S,
            r,
        )
        self.queue = _Histogram(
            "tandem_request_queue_time_seconds",
            "Waiting before admission: at the router plus in the worker's queue.",
            ("worker",),
            E2E_BUCKETS_S,
            r,
        )
        self.decision = _Histogram(
            "tandem_routing_decision_seconds",
            "Time to tokenize, score and choose a worker for one request.",
            (),
            DECISION_BUCKETS_S,
            r,
        )
        self._worker_gauges(r)
        self._children: dict[str, _WorkerGauges] = {}
        self._state_gauges(r, state)
        self.started = wall_clock()
        self.totals = {"requests_routed": 0, "requests_ended": 0, "tokens_relayed": 0}
        self.recent: deque[tuple[Any, ...]] = deque(maxlen=RECENT_DECISIONS)  # on_decision

    def _worker_gauges(self, r: CollectorRegistry) -> None:
        def gauge(name: str, doc: str, *labels: str) -> Gauge:
            # node: the worker's machine (Ready.node), one per worker: no more series.
            return Gauge(f"tandem_worker_{name}", doc, ["worker", "node", *labels], registry=r)

        self.g_active = gauge("active_requests", "Requests decoding, as of the last heartbeat.")
        self.g_queued = gauge("queued_requests", "Requests in the worker's queue.")
        self.g_inflight = gauge("inflight_requests", "Requests the router has assigned there.")
        self.g_kv_used = gauge("kv_used_tokens", "KV cells in use (active + prefix cache).")
        self.g_kv_cap = gauge("kv_capacity_tokens", "KV cells of the worker (n_ctx).")
        self.g_kv_usage = gauge("kv_usage_ratio", "kv_used_tokens / kv_capacity_tokens.")
        self.g_blocks = gauge("cached_blocks", "Prefix blocks the worker advertises.")
        self.g_cache = gauge("cache_tokens", "Prefix-cache tokens held, by tier.", "tier")
        self.g_cache_cap = gauge("cache_capacity_tokens", "Prefix-cache capacity, by tier.", "tier")
        self.g_cache_bytes = gauge(
            "cache_bytes", "Prefix-cache memory held (tokens x KV bytes a token), by tier.", "tier"
        )
        self.g_provisional = gauge(
            "provisional",
            "1 while the worker is priced on rates its served steps have not yet borne out "
            "(a stored profile or a quick start-up measurement), else 0.",
        )
        self.g_served = gauge(
            "served_ratio",
            "Work its relayed tokens show per busy second, valued at its own claimed rates "
            "(median of recent windows: about 1 when its claims hold; broker/observed.py).",
        )
        self.g_repriced = gauge(
            "repriced",
            "1 while the worker is priced below its claims because its served tokens do not "
            "bear them out (served_ratio below 1/3), else 0.",
        )
        self.g_prefill = gauge(
            "prefill_tokens_per_second", "Prefill rate: advertised or priced.", "source"
        )
        self.g_decode = gauge(
            "decode_tokens_per_second",
            "Aggregate decode rate at a batch size: advertised or priced.",
            "source",
            "batch",
        )
        self._per_worker = (
            self.g_active,
            self.g_queued,
            self.g_inflight,
            self.g_kv_used,
            self.g_kv_cap,
            self.g_kv_usage,
            self.g_blocks,
            self.g_cache,
            self.g_cache_cap,
            self.g_cache_bytes,
            self.g_provisional,
            self.g_served,
            self.g_repriced,
            self.g_prefill,
            self.g_decode,
        )

    def _state_gauges(self, r: CollectorRegistry, state: Callable | None) -> None:
        names = (
            ("tandem_workers", "Registered workers."),
            ("tandem_requests_in_flight", "Requests assigned to a worker."),
            ("tandem_requests_pending", "Requests waiting for a worker."),
        )
        for i, (name, doc) in enumerate(names):
            g = Gauge(name, doc, registry=r)
            if state is not None:
                g.set_function(partial(_state_value, state, i))

    # ------------------------------------------------------------ hooks
    def on_decision(
        self,
        request_id: str,
        policy: str,
        req: RouteRequest,
        decision: Decision,
        candidates: int,
        cached: int,
        elapsed_s: float,
    ) -> None:
        """A worker was chosen for ``req`` among ``candidates`` workers; it holds
        ``cached`` tokens of the prompt."""
        self.decision.observe((), elapsed_s)
        self.routed.inc((decision.worker_id, policy))
        self.totals["requests_routed"] += 1
        score = decision.scores.get(decision.worker_id)
        # Kept as a tuple, made the status reply's dict when read (``activity``).
        self.recent.append((self.wall_clock(), request_id, decision.worker_id, policy, candidates,
                            req.prompt_tokens, cached, score, elapsed_s))  # fmt: skip

    def on_tokens(self, worker_id: str, n: int) -> None:
        self.generation_tokens.inc((worker_id,), n)
        self.totals["tokens_relayed"] += n

    def on_done(self, policy: str, finish_reason: str, stats: p.DoneStats) -> None:
        """A request finished on a worker; ``stats`` are the Done stats sent to the client."""
        self.on_outcome(policy, finish_reason)
        key = (stats.worker or "",)
        self.served.inc((key[0], finish_reason))
        self.prompt_tokens.inc(key, stats.prompt_tokens or 0)
        self.cached_tokens.inc(key, stats.cached_tokens or 0)
        if stats.ttft_s is not None:
            self.ttft.observe(key, stats.ttft_s)
        self.e2e.observe(key, stats.e2e_s or 0.0)
        self.queue.observe(key, stats.queue_s or 0.0)

    def on_outcome(self, policy: str, outcome: str) -> None:
        """A request ended: ``outcome`` is a finish reason or an error code."""
        self.requests.inc((outcome, policy or "none"))
        self.totals["requests_ended"] += 1

    def on_connection_refused(self, socket: str) -> None:
        """A connection refused for its address's count (the ZAP thread calls it)."""
        self.connections_refused.labels(socket).inc()

    def on_rejected(self, source: str, reason: str) -> None:
        """A refused frame; ``reason``: a ``protocol.Refusal`` (a small fixed set)."""
        self.rejected.labels(source, reason).inc()

    def on_heartbeat(self, w: WorkerState, priced: Rates) -> None:
        """Per-worker gauges from a heartbeat; ``priced``: the rates routing uses now.

        Every worker heartbeats a few times a second: its gauge children are looked
        up once (``labels`` costs more than ``set``), and the rate tables are set
        only when they changed, at the batch sizes of ``common.steptime.batch_ladder``.
        """
        hb, wid, key = w.heartbeat, w.id, (w.id, w.info.node)
        if hb is None:
            return
        g = self._children.get(wid)
        if g is None:
            g = self._children[wid] = _WorkerGauges(
                self.g_active.labels(*key),
                self.g_queued.labels(*key),
                self.g_inflight.labels(*key),
                self.g_kv_used.labels(*key),
                self.g_kv_cap.labels(*key),
                self.g_kv_usage.labels(*key),
                self.g_blocks.labels(*key),
                self.g_provisional.labels(*key),
                self.g_served.labels(*key),
                self.g_repriced.labels(*key),
                rates={},
            )
        cap = hb.kv_capacity_tokens
        now = (len(hb.active), len(hb.queued), len(w.inflight), hb.kv_used_tokens, cap,
               len(w.cache.held), int(w.provisional), w.served.ratio or 0.0,
               int(w.served.repriced))  # fmt: skip
        if now != g.last:  # an idle worker's heartbeats change nothing here
            g.last = now
            g.active.set(now[0])
            g.queued.set(now[1])
            g.inflight.set(now[2])
            g.kv_used.set(hb.kv_used_tokens)
            g.kv_cap.set(cap)
            g.kv_usage.set(hb.kv_used_tokens / cap if cap else 0.0)
            g.blocks.set(now[5])
            g.provisional.set(now[6])
            g.served.set(now[7])
            g.repriced.set(now[8])
        self._tiers(g, key, w.cache.tiers)
        self._rates(g, key, "advertised", w.info.prefill_tok_s, w.info.decode_tok_s)
        self._rates(g, key, "priced", priced.prefill_tok_s, priced.decode_tok_s)

    def _tiers(self, g: _WorkerGauges, key: tuple[str, str], tiers: dict[str, int]) -> None:
        """The prefix cache's tiers as the worker's last cache report gave them."""
        if not tiers or tiers == g.tiers:
            return
        g.tiers = tiers
        per_token = tiers.get("kv_bytes_per_token", 0)
        for tier, held, cap in _TIER_FIELDS:
            self.g_cache.labels(*key, tier).set(tiers.get(held, 0))
            self.g_cache_cap.labels(*key, tier).set(tiers.get(cap, 0))
            self.g_cache_bytes.labels(*key, tier).set(tiers.get(held, 0) * per_token)

    def _rates(
        self,
        g: _WorkerGauges,
        key: tuple[str, str],
        source: str,
        prefill: float,
        decode: Sequence[float],
    ) -> None:
        table = (prefill, tuple(decode))
        if g.rates.get(source) == table:
            return
        g.rates[source] = table
        self.g_prefill.labels(*key, source).set(prefill)
        for batch in batch_ladder(len(decode)):
            self.g_decode.labels(*key, source, str(batch)).set(decode[batch - 1])

    def on_worker_removed(self, worker_id: str) -> None:
        """Drop a departed worker's gauges (its counters stay: they are history)."""
        self._children.pop(worker_id, None)
        for g in self._per_worker:
            for labels in [k for k in _label_sets(g) if k[0] == worker_id]:
                g.remove(*labels)

    # ------------------------------------------------------------ status / serving
    def activity(self) -> dict[str, Any]:
        """Totals since the router started and recent decisions (the status reply's)."""
        return {
            **self.totals,
            "uptime_s": round(self.wall_clock() - self.started, 3),
            "recent_decisions": [_decision_row(*d) for d in self.recent],
        }


def _label_sets(g: Gauge) -> list[tuple[str, ...]]:
    # prometheus-client has no public listing of a metric's children; its _metrics
    # dict (label values -> child) is the documented-by-use way to find them.
    return cast(list[tuple[str, ...]], list(g._metrics))  # noqa: SLF001


def _state_value(state: Callable[[], Sequence[int]], i: int) -> float:
    return float(state()[i])


def _decision_row(
    at: float,
    request: str,
    worker: str,
    policy: str,
    candidates: int,
    prompt_tokens: int,
    cached_tokens: int,
    score: float | None,
    elapsed_s: float,
) -> dict[str, Any]:
    """One of the status reply's recent decisions (from ``RouterMetrics.recent``)."""
    return {
        "time": round(at, 3),
        "request": request,
        "worker": worker,
        "policy": policy,
        "candidates": candidates,
        "prompt_tokens": prompt_tokens,
        "cached_tokens": cached_tokens,
        "score": score,
        "decision_ms": round(elapsed_s * 1e3, 3),
    }


class _Counter:
    """A labelled counter the router thread alone writes: its values by label values,
    exported as prometheus-client's ``Counter`` of the same name exports them (the
    ``_total`` samples; no ``_created``, which serving turns off anyway)."""

    def __init__(
        self, name: str, doc: str, labels: tuple[str, ...], registry: CollectorRegistry
    ) -> None:
        self.name, self.doc, self.labels = name, doc, labels
        self.values: dict[tuple[str, ...], float] = {}
        registry.register(self)

    def inc(self, key: tuple[str, ...], n: float = 1.0) -> None:
        if n < 0:  # as prometheus-client's Counter
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        values = self.values
        values[key] = values.get(key, 0.0) + n

    def describe(self) -> list[Metric]:
        return [CounterMetricFamily(self.name, self.doc, labels=self.labels)]

    def collect(self) -> list[Metric]:
        family = CounterMetricFamily(self.name, self.doc, labels=self.labels)
        for key, value in list(self.values.items()):  # one step in C: the router may write
            family.add_metric(key, value)
        return [family]


class _Histogram:
    """A labelled histogram the router thread alone writes (see ``_Counter``): per
    label values, a count per bucket (``le`` inclusive, +Inf last) and the sum, as
    prometheus-client's ``Histogram`` keeps them; one bisection per observation."""

    def __init__(
        self,
        name: str,
        doc: str,
        labels: tuple[str, ...],
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        self.name, self.doc, self.labels = name, doc, labels
        self.bounds = (*(float(b) for b in buckets), math.inf)
        self._les = [floatToGoString(b) for b in self.bounds]
        self.values: dict[tuple[str, ...], list[float]] = {}  # bucket counts, then the sum
        registry.register(self)

    def observe(self, key: tuple[str, ...], amount: float) -> None:
        row = self.values.get(key)
        if row is None:
            row = self.values[key] = [0.0] * (len(self.bounds) + 1)
        row[-1] += amount
        if amount <= math.inf:  # NaN falls in no bucket (prometheus-client's loop)
            row[bisect_left(self.bounds, amount)] += 1

    def describe(self) -> list[Metric]:
        return [HistogramMetricFamily(self.name, self.doc, labels=self.labels)]

    def collect(self) -> list[Metric]:
        family = HistogramMetricFamily(self.name, self.doc, labels=self.labels)
        for key, row in list(self.values.items()):
            counts, total = row[:-1], row[-1]  # row[:] is one step in C as well
            acc, buckets = 0.0, []
            for le, count in zip(self._les, counts, strict=True):
                acc += count
                buckets.append((le, acc))
            family.add_metric(key, buckets, total)
        return [family]


# tier label, its held tokens' and capacity's keys in a worker's CacheTiers
_TIER_FIELDS = (
    ("device", "cache_tokens", "cache_capacity_tokens"),
    ("host", "host_cache_tokens", "host_cache_capacity_tokens"),
)


@dataclass
class _WorkerGauges:
    """One worker's gauge children, looked up once, and the rate tables last set."""

    active: Any
    queued: Any
    inflight: Any
    kv_used: Any
    kv_cap: Any
    kv_usage: Any
    blocks: Any
    provisional: Any
    served: Any
    repriced: Any
    rates: dict[str, tuple[float, tuple[float, ...]]]
    last: tuple[float, ...] = ()  # the values last set
    tiers: dict[str, int] = field(default_factory=dict)  # the cache tiers last set
