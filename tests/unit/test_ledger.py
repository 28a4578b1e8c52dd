"""The router's view of its workers: the ledger between heartbeats, cache estimates of
queued requests, heartbeat reconciliation, and the calibration of what policies see.

The router runs in-process on inproc:// sockets and is pumped by hand, with fake
workers and a fake client on DEALER sockets: no threads, no timing, no model.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tandem.broker.calibration import Calibration
from tandem.broker.policies import Load, WorkerView
from tandem.broker.router import RouterConfig
from tandem.common import protocol as p
from tandem.common.blocks import block_hashes
from tandem.common.settings import Addresses
from tests.helpers import Harness

FAST = (2551.0, [293.0, 533.0, 732.0, 902.0])
SLOW = (73.0, [45.0, 58.0, 64.0, 68.0])


def row(wid: str, prompt: int, cached: int, prefill_remaining: int, decode: int) -> dict:
    """One request as a heartbeat lists it."""
    return {"id": wid, "prompt": prompt, "cached": cached,
            "prefill_remaining": prefill_remaining, "decode_remaining": decode}  # fmt: skip


def prompt(i: int, n: int = 64) -> list[int]:
    return [(i * 7 + k) % 1000 for k in range(n)]


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Callable[..., Harness]]:
    made: list[Harness] = []

    def factory(**cfg: Any) -> Harness:
        made.append(Harness(tmp_path, **cfg))
        return made[-1]

    yield factory
    for harness in made:
        harness.close()


@pytest.fixture
def h(make: Callable[..., Harness]) -> Harness:
    return make()


# ------------------------------------------------------------ bursts faster than heartbeats
def test_burst_sees_its_own_assignments(h: Harness) -> None:
    h.add_worker("a", (100.0, [50.0]))
    h.add_worker("b", (100.0, [50.0]))
    choices = [h.submit(f"r{i}", prompt(i)).worker_id for i in range(6)]
    # No heartbeat arrived in between: only the ledger can tell a and b apart.
    assert choices == ["a", "b", "a", "b", "a", "b"]
    for i, d in enumerate(h.decisions()):
        seen = {c["id"]: c["queued"] for c in d["candidates"]}
        assert seen == {"a": (i + 1) // 2, "b": i // 2}
        assert {c["id"]: c["D"] for c in d["candidates"]} == {
            "a": 32 * ((i + 1) // 2 + 1), "b": 32 * (i // 2 + 1)}  # fmt: skip


def test_burst_offloads_to_slow_worker_once_fast_backlog_outweighs_it(h: Harness) -> None:
    h.add_worker("fast", FAST)
    h.add_worker("slow", SLOW)
    choices = [h.submit(f"r{i}", prompt(i, 32), max_tokens=128).worker_id for i in range(24)]
    first_slow = choices.index("slow")
    assert first_slow >= 8 and set(choices[:first_slow]) == {"fast"}
    d = h.decisions()[first_slow]
    score = {c["id"]: c["score"] for c in d["candidates"]}
    slow = next(c for c in d["candidates"] if c["id"] == "slow")
    assert (slow["P"], slow["D"]) == (32, 128)  # idle: only the new request
    assert score["slow"] == pytest.approx(32 / 73 + 128 / 45)
    fast = next(c for c in d["candidates"] if c["id"] == "fast")
    assert fast["queued"] == first_slow and score["fast"] > score["slow"]
    prev = h.decisions()[first_slow - 1]["candidates"]
    assert [c["score"] for c in prev if c["id"] == "fast"][0] < score["slow"]


def test_heartbeat_without_new_requests_keeps_the_ledger(h: Harness) -> None:
    h.add_worker("a", (100.0, [50.0]))
    h.submit("r0", prompt(0))
    wid = h.assigned("a").request_id
    h.heartbeat("a", 1)  # sent before the Assign arrived: lists nothing
    v = h.view("a", prompt(1))
    assert v.active == () and v.queued == (Load(64, 32),)
    h.heartbeat("a", 2, active=[row(wid, 64, 0, 0, 20)])
    assert h.view("a", prompt(1)).active == (Load(0, 20),)


# ------------------------------------------------------------ cache estimates
def test_queued_request_keeps_its_cache_estimate(h: Harness) -> None:
    prefix = prompt(3, 64)
    h.add_worker("a", (100.0, [50.0]))
    h.heartbeat("a", 1, blocks=block_hashes(prefix, 16))
    acc = h.submit("r0", prefix + prompt(9, 16))
    assign = h.assigned("a")
    assert acc.cached_tokens == assign.cached_estimate == 64
    wid = assign.request_id
    # Queued on the worker (which matches its cache only at admission): 80 - 64.
    h.heartbeat("a", 2, queued=[row(wid, 80, 0, 80, 32)], blocks=block_hashes(prefix, 16))
    assert h.view("a", prompt(5)).queued == (Load(16, 32),)
    # The worker evicted the prefix meanwhile: new prompts see it, the queued one
    # keeps its estimate until the worker reports otherwise.
    h.heartbeat("a", 3, queued=[row(wid, 80, 0, 80, 32)])
    assert h.view("a", prefix + prompt(8, 16)).cached_tokens == 0
    assert h.view("a", prompt(5)).queued == (Load(16, 32),)
    # Admitted with a miss: the worker's own numbers now hold.
    h.heartbeat("a", 4, active=[row(wid, 80, 0, 80, 32)])
    assert h.view("a", prompt(5)).active == (Load(80, 32),)


# ------------------------------------------------------------ reconciliation
def test_relayed_tokens_prove_a_request_active_despite_an_older_heartbeat(h: Harness) -> None:
    h.add_worker("a", (100.0, [50.0]))
    h.submit("r0", prompt(0))
    wid = h.assigned("a").request_id
    h.heartbeat("a", 1, queued=[row(wid, 64, 0, 64, 32)])  # sent before its admission
    assert h.view("a", prompt(1)).queued == (Load(64, 32),)
    h.workers["a"].send(p.TokenDelta(wid, [1, 2], "x"))  # it is decoding already
    h.pump()
    v = h.view("a", prompt(1))
    assert v.active == (Load(0, 30),) and v.queued == ()


def test_relayed_tokens_and_done_reconcile_with_heartbeats(h: Harness) -> None:
    h.add_worker("a", (100.0, [50.0]))
    h.submit("r0", prompt(0))
    wid = h.assigned("a").request_id
    h.heartbeat("a", 1, active=[row(wid, 64, 0, 0, 31)])
    # Tokens relayed after that heartbeat are fresher than it: 32 - 5 left.
    h.workers["a"].send(p.TokenDelta(wid, [1, 2, 3, 4, 5], "x"))
    h.pump()
    assert h.view("a", prompt(1)).active == (Load(0, 27),)
    # A stale heartbeat claiming more work left does not raise the budget again.
    h.heartbeat("a", 2, active=[row(wid, 64, 0, 0, 32)])
    assert h.view("a", prompt(1)).active == (Load(0, 27),)
    h.workers["a"].send(p.Done(wid, "length", {"output_tokens": 32}))
    h.pump()
    # Finished: gone, even though the last heartbeat still lists it.
    v = h.view("a", prompt(1))
    assert v.active == () and v.queued == () and h.router.workers["a"].inflight == {}


def test_router_options_reach_log_and_status(make: Callable[..., Harness]) -> None:
    h = make(calibrate=True, decode_estimate="ratio")
    h.add_worker("a", (100.0, [50.0, 80.0]))
    h.submit("r0", prompt(0))
    d = h.decisions()[0]
    assert d["calibrated"] is True and d["decode_estimate"] == "ratio" and d["decode_ratio"] == 1
    h.client.send(p.StatusQuery())
    h.pump()
    status = h.recv(h.client)
    assert isinstance(status, p.StatusReply)
    assert status.workers[0]["calibrated_decode_tok_s"] == [50.0, 80.0]
    with pytest.raises(ValueError):
        RouterConfig(Addresses("inproc://x", "inproc://y"), decode_estimate="guess")


# ------------------------------------------------------------ calibration
def test_decode_ratio_scales_every_budget() -> None:
    cal = Calibration(decode_estimate="ratio")
    for _ in range(3):
        cal.on_done("a", {"output_tokens": 32}, "eos", 128, t_first=1.0, now=2.0)
    assert cal.ratio == 1.0  # too few samples yet
    cal.on_done("a", {"output_tokens": 32}, "length", 128, t_first=1.0, now=2.0)
    cal.on_done("a", {"output_tokens": 0}, "cancelled", 128, t_first=1.0, now=2.0)  # ignored
    assert cal.ratio == 0.25
    assert cal.route_request(100, 128).max_tokens == 32
    v = WorkerView("a", 100.0, (50.0,), active=(Load(0, 100),), queued=(Load(7, 9),))
    adjusted = cal.adjust(v)
    assert adjusted.active == (Load(0, 25),) and adjusted.queued == (Load(7, 3),)
    assert adjusted.prefill_rate == 100.0  # rates untouched without --calibrate
    assert Calibration(decode_estimate="budget").route_request(100, 128).max_tokens == 128


def test_calibrated_decode_rate_by_batch_size() -> None:
    cal = Calibration(calibrate=True)
    cal.register("a", 100.0, [100.0, 180.0, 240.0])
    cal.on_heartbeat("a", 2, now=10.0)
    # 51 tokens (50 decode steps) in 1 s with 2 requests decoding: 100 tok/s at batch 2.
    stats = {"prompt_tokens": 8, "cached_tokens": 0, "output_tokens": 51, "decode_s": 1.0}
    cal.on_done("a", stats, "length", 64, t_first=10.5, now=11.5)
    w = cal.workers["a"]
    assert w.decode_factor == {2: pytest.approx(100 / 180)}
    # Unobserved batch sizes borrow the nearest observed factor: the shape is kept.
    assert cal.adjust(WorkerView("a", 100.0, (100.0, 180.0, 240.0))).decode_rates == pytest.approx(
        (100 * 100 / 180, 100.0, 240 * 100 / 180)
    )


def test_prefill_is_calibrated_only_from_requests_that_ran_alone() -> None:
    cal = Calibration(calibrate=True)
    cal.register("a", 100.0, [50.0])
    cal.on_heartbeat("a", 3, now=0.0)
    stats = {"prompt_tokens": 520, "cached_tokens": 8, "prefill_s": 2.0, "output_tokens": 1}
    cal.on_done("a", stats, "length", 1, t_first=3.0, now=3.0)
    assert cal.workers["a"].prefill_factor is None  # shared the worker: not a clean sample
    cal.on_heartbeat("a", 1, now=5.0)
    cal.on_done("a", stats, "length", 1, t_first=8.0, now=8.0)
    assert cal.workers["a"].prefill_factor == pytest.approx(256 / 100)
    assert cal.adjust(WorkerView("a", 100.0, (50.0,))).prefill_rate == pytest.approx(256.0)
    cal.forget("a")
    assert cal.adjust(WorkerView("a", 100.0, (50.0,))).prefill_rate == 100.0


def test_a_lost_worker_s_unseen_requests_are_routed_again_in_order(h: Harness) -> None:
    h.add_worker("a", FAST)
    for rid in ("seen", "unseen-1", "unseen-2"):
        h.submit(rid, prompt(1))
    seen, first, second = (h.assigned("a") for _ in range(3))
    h.workers["a"].send(p.TokenDelta(seen.request_id, [5], "t5"))
    h.pump()
    assert isinstance(h.recv(h.client), p.TokenDelta)  # "seen" showed the client a token
    h.workers["a"].send(p.Goodbye("a"))
    h.pump()
    lost = h.recv(h.client)
    assert isinstance(lost, p.Error) and (lost.code, lost.request_id) == (p.WORKER_LOST, "seen")
    assert [r.submit.request_id for r in h.router.pending] == ["unseen-1", "unseen-2"]
    assert not h.client.poll(50)  # they wait for a worker instead of failing
    h.client.send(p.StatusQuery())
    h.pump()
    status = h.recv(h.client)
    assert isinstance(status, p.StatusReply)
    assert (status.requests_in_flight, status.requests_pending, status.workers) == (0, 2, [])
    h.add_worker("b", FAST)
    again = [h.assigned("b") for _ in range(2)]
    assert [a.tokens for a in again] == [first.tokens, second.tokens]
    accepted = [h.recv(h.client) for _ in range(2)]
    assert [(m.request_id, m.worker_id) for m in accepted] == [("unseen-1", "b"), ("unseen-2", "b")]
    h.workers["b"].send(p.Done(again[0].request_id, "length", {}))
    h.pump()
    done = h.recv(h.client)
    assert isinstance(done, p.Done) and done.stats["rerouted_from"] == ["a"]
    assert done.stats["worker"] == "b"


def test_a_running_request_calibrates_decode_before_it_finishes() -> None:
    cal = Calibration(calibrate=True)
    cal.register("a", 100.0, [400.0, 600.0])
    cal.on_heartbeat("a", 2, now=10.0)
    cal.on_progress("a", 7, t_first=10.0, now=10.1)  # too few tokens to say anything
    assert cal.workers["a"].decode_factor == {}
    # 17 tokens relayed, 16 decode steps in 0.4 s, 2 decoding: 80 tok/s at batch 2.
    cal.on_progress("a", 17, t_first=10.0, now=10.4)
    assert cal.workers["a"].decode_factor == {2: pytest.approx(80 / 600)}
    Calibration(calibrate=False).on_progress("a", 17, t_first=10.0, now=10.4)  # a no-op


def test_the_router_samples_decode_mid_flight(make: Callable[..., Harness]) -> None:
    """A worker advertising 100,000 tok/s that relays ~100 tok/s is re-priced after 16
    tokens, long before its request ends."""
    h = make(calibrate=True)
    h.add_worker("a", (1000.0, [1e5]))
    h.submit("r0", prompt(0), max_tokens=500)
    wid = h.assigned("a").request_id
    h.heartbeat("a", 1, active=[row(wid, 64, 0, 0, 500)])
    h.workers["a"].send(p.TokenDelta(wid, [1], "t1"))
    h.pump()
    time.sleep(0.15)
    h.workers["a"].send(p.TokenDelta(wid, list(range(2, 17)), "t"))
    h.pump()
    h.client.send(p.StatusQuery())
    h.pump()
    rows = [m for m in (h.recv(h.client) for _ in range(3)) if isinstance(m, p.StatusReply)]
    assert rows[0].workers[0]["calibrated_decode_tok_s"][0] < 1000  # ~100, not 100,000


def test_status_table_shows_what_the_router_prices_with_now(make: Callable[..., Harness]) -> None:
    from tandem.cli.tables import workers_table

    h = make()  # calibration is on by default
    h.add_worker("a", (100.0, [50.0, 80.0]))
    h.client.send(p.StatusQuery())
    h.pump()
    reply = h.recv(h.client)
    assert isinstance(reply, p.StatusReply)
    header, _, line = workers_table(reply).splitlines()[1:4]
    assert header.endswith("prefill/s now  decode/s now")
    assert line.split()[-2:] == ["100", "50,80"]


@given(
    samples=st.lists(st.tuples(st.floats(0, 10, allow_nan=False), st.integers(0, 6)), max_size=12),
    t0=st.floats(-1, 11, allow_nan=False),
    span=st.floats(0.01, 5, allow_nan=False),
)
def test_mean_active_is_the_time_average_of_the_heartbeat_step_function(
    samples: list[tuple[float, int]], t0: float, span: float
) -> None:
    from collections import deque

    from tandem.broker.calibration import WorkerRates

    samples.sort(key=lambda s: s[0])
    w = WorkerRates(1.0, (1.0,))
    w.active = deque(samples)
    t1 = t0 + span
    known = [s for s in samples if s[0] < t1]
    if not known:
        assert w.mean_active(t0, t1) is None
        return
    start = max(t0, samples[0][0])  # before the first heartbeat nothing is known
    edges = sorted({start, t1, *(t for t, _ in known if start < t < t1)})
    area = 0.0
    for a, b in zip(edges, edges[1:], strict=False):
        area += [n for t, n in samples if t <= a][-1] * (b - a)  # the value holding at a
    got = w.mean_active(t0, t1)
    assert got == pytest.approx(area / (t1 - start), rel=1e-9, abs=1e-9)
