"""The router's metrics hooks, driven through an in-process Router (no HTTP, no timing)."""

from __future__ import annotations

import random

from prometheus_client import CollectorRegistry, Counter, Histogram

from tandem.broker.metrics import E2E_BUCKETS_S, _Counter, _Histogram
from tandem.common import protocol as p
from tests.helpers import Harness

RATES = (100.0, [50.0, 80.0])


def value(h: Harness, name: str, **labels: str) -> float | None:
    if name.startswith("tandem_worker_"):  # per-worker gauges name the node too
        labels.setdefault("node", "")
    return h.core.metrics.registry.get_sample_value(name, labels)


def test_a_request_moves_every_counter_once(h: Harness) -> None:
    h.add_worker("a", RATES)
    h.submit("r0", list(range(1, 40)), max_tokens=3)
    wid = h.assigned("a").request_id
    h.heartbeat("a", 1, active=[p.RequestRow(wid, 39, 0, 0, 3)])
    h.workers["a"].send(p.TokenDelta(wid, [5, 6], "xy"))
    stats = {"prompt_tokens": 39, "cached_tokens": 32, "output_tokens": 2}
    h.workers["a"].send(p.Done(wid, "eos", stats))
    h.pump()
    assert value(h, "tandem_requests_routed_total", worker="a", policy="phase_cost") == 1
    assert value(h, "tandem_generation_tokens_total", worker="a") == 2
    assert value(h, "tandem_prompt_tokens_total", worker="a") == 39
    assert value(h, "tandem_cached_prompt_tokens_total", worker="a") == 32
    assert value(h, "tandem_requests_total", outcome="eos", policy="phase_cost") == 1
    assert value(h, "tandem_time_to_first_token_seconds_count", worker="a") == 1
    assert value(h, "tandem_e2e_request_latency_seconds_count", worker="a") == 1
    assert value(h, "tandem_routing_decision_seconds_count") == 1
    assert value(h, "tandem_worker_active_requests", worker="a") == 1
    assert value(h, "tandem_worker_kv_capacity_tokens", worker="a") == 8192
    assert value(h, "tandem_worker_decode_tokens_per_second",
                 worker="a", source="advertised", batch="2") == 80.0  # fmt: skip
    assert value(h, "tandem_workers") == 1 and value(h, "tandem_requests_in_flight") == 0


def test_status_carries_totals_and_recent_decisions(h: Harness) -> None:
    h.add_worker("a", RATES)
    h.submit("r0", list(range(1, 20)))
    h.client.send(p.StatusQuery())
    h.pump()
    st = h.recv(h.client)
    assert isinstance(st, p.StatusReply)
    assert st.activity["requests_routed"] == 1
    (d,) = st.activity["recent_decisions"]
    assert d["request"] == "r0" and d["worker"] == "a" and d["prompt_tokens"] == 19


def test_failures_and_rejected_frames_are_counted(h: Harness) -> None:
    h.add_worker("a", RATES)
    h.client.send(
        p.Submit("big", tokens=[1] * 9000, sampling=p.SamplingParams(8))
    )  # over n_ctx 8192
    h.client.sock.send(b"\x01garbage")
    h.pump()
    assert value(h, "tandem_requests_total", outcome="prompt_too_long", policy="none") == 1
    assert value(h, "tandem_frames_rejected_total", source="client", reason="malformed") == 1


def test_a_departed_worker_loses_its_gauges_but_not_its_counters(h: Harness) -> None:
    h.add_worker("a", RATES)
    h.submit("r0", list(range(1, 20)))
    h.heartbeat("a", 1)
    assert value(h, "tandem_worker_queued_requests", worker="a") == 0
    h.workers["a"].send(p.Goodbye("a"))
    h.pump()
    assert value(h, "tandem_worker_queued_requests", worker="a") is None
    assert (
        value(h, "tandem_worker_prefill_tokens_per_second", worker="a", source="advertised") is None
    )
    assert value(h, "tandem_requests_routed_total", worker="a", policy="phase_cost") == 1


def test_a_wide_worker_exports_a_bounded_rate_table(h: Harness) -> None:
    # max active 256: /metrics shows batches 1, 2, 4 ... 256 per source, not 256 series
    h.add_worker("a", (100.0, [50.0 + b for b in range(8)]), max_active=256)
    h.heartbeat("a", 1)
    h.heartbeat("a", 2)  # unchanged rates: nothing is set again, nothing is lost
    samples = [
        s
        for m in h.core.metrics.registry.collect()
        if m.name == "tandem_worker_decode_tokens_per_second"
        for s in m.samples
        if s.labels["worker"] == "a" and s.labels["source"] == "priced"
    ]
    assert sorted(int(s.labels["batch"]) for s in samples) == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert value(h, "tandem_worker_decode_tokens_per_second",
                 worker="a", source="advertised", batch="8") == 57.0  # fmt: skip


def _samples(registry: CollectorRegistry) -> list[tuple[str, dict[str, str], float]]:
    return [
        (s.name, s.labels, s.value)
        for m in registry.collect()
        for s in m.samples
        if not s.name.endswith("_created")
    ]


def test_the_request_series_export_what_prometheus_client_would() -> None:
    # The series every request moves are plain numbers (broker/metrics.py): the same
    # events through prometheus-client's own Counter and Histogram give the same samples.
    rng = random.Random(7)
    ours, ref = CollectorRegistry(), CollectorRegistry()
    c = _Counter("t_requests", "Doc.", ("outcome", "policy"), ours)
    rc = Counter("t_requests", "Doc.", ["outcome", "policy"], registry=ref)
    h = _Histogram("t_latency_seconds", "Doc.", ("worker",), E2E_BUCKETS_S, ours)
    rh = Histogram("t_latency_seconds", "Doc.", ["worker"], buckets=E2E_BUCKETS_S, registry=ref)
    edges = [0.0, *E2E_BUCKETS_S, 1e9]
    for _ in range(2000):
        key = (rng.choice(["eos", "length", "cancelled"]), rng.choice(["a", "b"]))
        n = rng.choice([0, 1, 2.5, rng.random() * 100])
        c.inc(key, n)
        rc.labels(*key).inc(n)
        amount = rng.choice([rng.choice(edges), rng.random() * 600, rng.random() * 1e-3])
        h.observe((key[1],), amount)
        rh.labels(key[1]).observe(amount)
    assert _samples(ours) == _samples(ref)
    h.observe(("a",), float("nan"))
    rh.labels("a").observe(float("nan"))
    got, want = _samples(ours), _samples(ref)
    assert [x[:2] for x in got] == [x[:2] for x in want]
    assert [x[2] for x in got if "_sum" not in x[0]] == [x[2] for x in want if "_sum" not in x[0]]


def test_a_workers_node_reaches_status_top_and_its_gauges(h: Harness) -> None:
    """Ready.node (the worker's machine) is kept by the router: the status row's
    `node`, the status table's and top's node column, the per-worker gauges' label."""
    import io

    from rich.console import Console

    from tandem.cli import tables, top
    from tandem.common.transport import DealerSocket
    from tests.helpers import fake_ready

    sock = DealerSocket(h.router.worker_sock.address, identity=b"mac-gpu0")
    sock.send(p.replace(fake_ready("mac-gpu0", RATES, 4, h.spec), node="mac-studio"))
    h.pump()
    assert isinstance(h.recv(sock), p.Welcome)
    h.workers["mac-gpu0"] = sock
    h.heartbeat("mac-gpu0", 1)
    row = h.core.workers["mac-gpu0"].describe(True, 0.0)
    assert row["node"] == "mac-studio"
    gauge = "tandem_worker_kv_capacity_tokens"
    assert value(h, gauge, worker="mac-gpu0", node="mac-studio") == 8192
    reply = p.StatusReply(policy="x", workers=[row])
    assert "mac-studio" in tables.workers_table(reply).splitlines()[3]  # policy, head, rule
    out = io.StringIO()
    Console(file=out, width=240).print(top.workers_table([row]))
    assert "mac-studio" in out.getvalue()
    h.workers.pop("mac-gpu0").send(p.Goodbye("mac-gpu0"))
    h.pump()
    assert value(h, gauge, worker="mac-gpu0", node="mac-studio") is None  # gone with it


def test_each_worker_counts_what_it_was_routed_and_what_it_served(h: Harness) -> None:
    h.add_worker("a", RATES)
    h.add_worker("b", RATES)
    for i in range(4):
        h.submit(f"r{i}", list(range(1, 30 + i)), max_tokens=2)
    h.pump()
    routed = {w: value(h, "tandem_requests_routed_total", worker=w, policy="phase_cost") or 0
              for w in ("a", "b")}  # fmt: skip
    assert sum(routed.values()) == 4
    served = {"a": 0, "b": 0}
    for w in ("a", "b"):
        for _ in range(int(routed[w])):
            rid = h.assigned(w).request_id
            h.workers[w].send(p.Done(rid, "length", {"output_tokens": 2}))
            served[w] += 1
    h.pump()
    for w in ("a", "b"):
        got = value(h, "tandem_requests_served_total", worker=w, outcome="length") or 0
        assert got == served[w] == routed[w]
