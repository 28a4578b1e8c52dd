"""The lookahead policy: its forward replay checked against the real engine, its
forecast, when it defers to finish_time, and what it changes on a batch-hungry GPU."""

from __future__ import annotations

import random

import pytest

from tandem.bench.run import make_encoder
from tandem.bench.spec import parse_worker
from tandem.bench.workload import PromptBook, Workload
from tandem.broker.arrivals import ArrivalLog
from tandem.broker.policies import (
    FinishTime,
    Load,
    Lookahead,
    RouteRequest,
    WorkerView,
    parse_policy,
)
from tandem.broker.policies.lookahead import batch_hungry, expected_arrivals, finishes
from tandem.common import protocol as p
from tandem.common.protocol import SamplingParams
from tandem.twin.replay import TwinWorkerSpec, replay
from tandem.twin.world import NO_DELAY, TwinWorker, World
from tandem.workers.device_model import SimProfile
from tandem.workers.engine import EngineConfig
from tandem.workers.request import Request

GPU = SimProfile("gpu", 2551.0, tuple(0.003413 * (1 + 0.1 * b) for b in range(8)))


def _view(w: TwinWorker, max_active: int, step_tokens: int) -> WorkerView:
    e = w.engine
    return WorkerView(
        "w", GPU.prefill_tok_s, tuple(GPU.decode_tok_s()), max_active,
        active=tuple(Load(r.prefill_remaining, r.decode_remaining) for r in e.active),
        queued=tuple(Load(r.prefill_remaining, r.decode_remaining) for r in e.queue),
        step_tokens=step_tokens,
    )  # fmt: skip


@pytest.mark.parametrize("seed", range(30))
def test_finishes_equal_what_the_engine_does_with_requests_arriving_later(seed):
    """Requests that join at their arrival times end when the engine ends them."""
    rng = random.Random(seed)
    max_active, step_tokens = rng.choice([1, 3, 8]), rng.choice([16, 64, 256])
    step_tokens = max(step_tokens, max_active)
    # Plans by the token budget: the worker's time budget (step_budget_x) follows its own
    # live step model, which the router does not replay.
    cfg = EngineConfig(
        max_active=max_active, step_tokens=step_tokens, cache_tokens=0, step_budget_x=0
    )
    w = TwinWorker(World(), "w", GPU, cfg, lambda wid, msgs: None, NO_DELAY)
    for i in range(rng.randint(0, 10)):
        sampling = SamplingParams(max_tokens=rng.randint(1, 60), ignore_eos=True)
        w.engine.submit(Request(f"r{i}", [1000 + i] * rng.randint(1, 600), sampling))
    for _ in range(rng.randint(0, 20)):
        if w.engine.queue or w.engine.active:
            w.engine.step()
    extras = sorted(
        (round(rng.uniform(0.0, 0.4), 4), rng.randint(1, 500), rng.randint(1, 60))
        for _ in range(rng.randint(1, 5))
    )
    predicted, _ = finishes(_view(w, max_active, step_tokens), extras)
    start, ended, waiting = w.now, {}, list(enumerate(extras))
    while len(ended) < len(extras):
        while waiting and waiting[0][1][0] <= w.now - start + 1e-12:
            i, (_, prompt, budget) = waiting.pop(0)
            sampling = SamplingParams(max_tokens=budget, ignore_eos=True)
            w.engine.submit(Request(f"x{i}", [7] * prompt, sampling))
        if not (w.engine.queue or w.engine.active):
            w.now = start + waiting[0][1][0]  # idle until the next arrival
            continue
        w.engine.step()
        for m in w._out:
            if isinstance(m, p.Done) and m.request_id.startswith("x"):
                ended.setdefault(int(m.request_id[1:]), w.now - start)
    assert [ended[i] for i in range(len(extras))] == pytest.approx(predicted, rel=1e-9, abs=1e-9)


def test_the_arrival_log_keeps_a_bounded_window_newest_first():
    log = ArrivalLog()
    assert log.note(10.0) == ()
    assert log.note(10.5) == (0.5,)
    assert log.note(11.0) == pytest.approx((0.5, 1.0))
    assert log.note(30.0) == ()  # older than the window
    for i in range(200):
        before = log.note(31.0 + i * 0.01)
    assert len(before) == ArrivalLog.KEEP


def test_the_forecast_expects_as_many_as_came_in_the_same_span():
    req = RouteRequest(516, 128, (0.05, 0.1, 0.15, 5.0))
    assert expected_arrivals(req, 1.0, 8) == pytest.approx([0.05, 0.1, 0.15])
    assert expected_arrivals(req, 1.0, 2) == pytest.approx([0.05, 0.1])
    assert expected_arrivals(RouteRequest(516, 128), 1.0, 8) == []
    assert expected_arrivals(req, 0.01, 8) == []  # none came within the horizon


# A launch-bound GPU whose decode step shortens as its batch grows (10 ms at 1-2 rows,
# 8 ms from 6: per-request speed rises with the batch, as the H200's did), and a CPU
# twice as fast alone that slows as its batch grows.
GPU_STEP_MS = (10.0, 10.0, 9.5, 9.0, 8.5) + (8.0,) * 11
HUNGRY_GPU = tuple(1000.0 * b / ms for b, ms in enumerate(GPU_STEP_MS, 1))
CPU_RATES = (200.0, 220.0, 230.0, 240.0)


def _pair(gpu_active: int = 1, cpu_active: int = 0) -> list[WorkerView]:
    cpu = WorkerView("cpu", 900.0, CPU_RATES, 4, cached_tokens=512,
                     active=(Load(0, 100),) * cpu_active)  # fmt: skip
    gpu = WorkerView("gpu", 20000.0, HUNGRY_GPU, 16, cached_tokens=512,
                     active=(Load(0, 120),) * gpu_active)  # fmt: skip
    return [cpu, gpu]


def test_batch_hunger_is_read_from_the_step_model():
    cpu, gpu = _pair()
    assert batch_hungry(gpu) and not batch_hungry(cpu)
    full = WorkerView("gpu", 20000.0, HUNGRY_GPU, 16, active=(Load(0, 9),) * 16)
    assert not batch_hungry(full)  # no room to grow


def test_without_arrivals_or_hunger_it_places_as_finish_time():
    alone = RouteRequest(516, 128)
    assert Lookahead().choose(alone, _pair()) == FinishTime().choose(alone, _pair())
    cpus = [WorkerView(f"c{i}", 900.0, CPU_RATES, 4, cached_tokens=512) for i in range(2)]
    burst = RouteRequest(516, 128, (0.05, 0.1))
    assert Lookahead().choose(burst, cpus).worker_id == FinishTime().choose(burst, cpus).worker_id


def test_in_a_burst_it_joins_the_batch_the_next_arrivals_will_fill():
    """Each worker holds one request. finish_time sends the next to the CPU (at batch 2
    it decodes 110 tok/s a request, the GPU at 2 only 100); with five more coming,
    the GPU's batch grows to 8 ms steps (125 a request) and carries it faster, and
    the CPU keeps decoding its own request alone."""
    req = RouteRequest(516, 128, (0.05, 0.1, 0.15, 0.2, 0.25))
    assert FinishTime().choose(req, _pair(1, 1)).worker_id == "cpu"
    decision = Lookahead().choose(req, _pair(1, 1))
    assert decision.worker_id == "gpu"
    assert decision.scores["gpu"] < decision.scores["cpu"]
    assert parse_policy("lookahead").name == "lookahead"


# The step times the H200's GPU served in the 8-bursts at GPU max active 16
# (docs/results/h200/matrix-warm/, the runs that used both workers): aggregate
# decode tok/s by batch, and the CPU's at max active 4.
H200_GPU = (117, 163, 277, 318, 569, 570, 706, 989, 1104, 1234, 1379, 1540, 1721, 1922, 2139, 2400)
H200_CPU = (161, 239, 265, 291)


def _served(wid: str, prefill: float, rates: tuple[int, ...], active: int) -> TwinWorkerSpec:
    steps = tuple(b / float(r) for b, r in enumerate(rates, 1))
    return TwinWorkerSpec(wid, SimProfile(wid, prefill, steps), active)


def test_on_the_h200_s_served_step_times_the_8_burst_ends_sooner():
    """The twin (the engine's schedule on the served step times) replays the seed
    8-burst: lookahead keeps more of it on the GPU and ends it sooner."""
    specs = [_served("cpu", 1027.0, H200_CPU, 4), _served("gpu", 18213.0, H200_GPU, 16)]
    encode = make_encoder([parse_worker("sim:h200-gpu", set())])
    wl = Workload(kind="burst", requests=8, spacing_s=0.05, same_prompt=True)
    book = PromptBook(encode, wl)

    def run(policy: str) -> tuple[float, int]:
        rep = replay(specs, policy, wl.arrivals(0), book)
        t0 = min(r.submit_s for r in rep.records)
        end = max(r.token_s[-1] for r in rep.records)
        return end - t0, sum(r.worker == "cpu" for r in rep.records)

    (greedy, greedy_cpu), (ahead, ahead_cpu) = run("finish_time"), run("lookahead")
    assert ahead_cpu < greedy_cpu
    assert ahead < 0.95 * greedy


def test_the_twin_router_hands_each_burst_request_the_arrivals_before_it():
    """Arrivals are noted as client requests come (not the pinned prefix seeds), and
    every decision record says what the policy was told."""
    specs = [_served("cpu", 1027.0, H200_CPU, 4), _served("gpu", 18213.0, H200_GPU, 16)]
    encode = make_encoder([parse_worker("sim:h200-gpu", set())])
    wl = Workload(kind="burst", requests=5, spacing_s=0.05, same_prompt=True)
    rep = replay(specs, "lookahead", wl.arrivals(0), PromptBook(encode, wl))
    told = [d.get("arrivals_before", []) for d in rep.decisions]
    assert [len(t) for t in told] == [0, 1, 2, 3, 4]
    assert told[4] == pytest.approx([0.05, 0.1, 0.15, 0.2], abs=1e-6)


def test_route_explain_states_carry_the_arrivals_lookahead_reads():
    from tandem.broker.policies.state import state_from_json

    worker = {"prefill_rate": 900.0, "cached_tokens": 512, "active": [
        {"prefill_remaining": 0, "decode_remaining": 100}]}  # fmt: skip
    state = {
        "request": {"prompt_tokens": 516, "max_tokens": 128,
                    "arrivals_before": [0.05, 0.1, 0.15, 0.2, 0.25]},
        "workers": [worker | {"id": "cpu", "decode_rate": list(CPU_RATES)},
                    worker | {"id": "gpu", "decode_rate": list(HUNGRY_GPU), "prefill_rate": 2e4,
                              "active": [{"prefill_remaining": 0, "decode_remaining": 120}]}],
    }  # fmt: skip
    req, views = state_from_json(state)
    assert Lookahead().choose(req, views).worker_id == "gpu"
    state["request"] = {"prompt_tokens": 516, "max_tokens": 128}
    req, views = state_from_json(state)
    assert Lookahead().choose(req, views).worker_id == "cpu"
    for bad in ([0.2, 0.1], [-1.0], ["x"], 0.5, [float("nan")]):
        state["request"] = {"prompt_tokens": 516, "max_tokens": 128, "arrivals_before": bad}
        with pytest.raises(ValueError, match="arrivals_before"):
            state_from_json(state)


def test_past_its_rate_bound_it_decides_as_finish_time():
    req = RouteRequest(516, 128, (0.05, 0.1, 0.15, 0.2, 0.25))
    assert Lookahead().choose(req, _pair(1, 1)).worker_id == "gpu"
    flood = RouteRequest(516, 128, tuple(0.001 * i for i in range(1, Lookahead.MAX_PER_S + 2)))
    assert Lookahead().choose(flood, _pair(1, 1)) == FinishTime().choose(flood, _pair(1, 1))


def test_the_twin_replays_the_recorded_lookahead_bench():
    """The recorded bench of docs/results/lookahead-sim (tests/fixtures/lookahead-sim):
    the live router (real processes, sim devices) and the twin place every case alike
    and agree on makespan within the twin's 3 %."""
    import json
    from pathlib import Path

    from tandem.twin.validate import TOLERANCE, compare

    root = Path(__file__).resolve().parents[2]
    # the recorded worker specs name their profiles from the repository root
    text = (root / "tests/fixtures/lookahead-sim/result.json").read_text()
    doc = json.loads(text.replace("sim:tests/fixtures/", f"sim:{root}/tests/fixtures/"))
    encode = make_encoder([parse_worker("sim:h200-gpu", set())])
    rows = compare(doc, encode)
    assert {r["policy"].split("+")[0] for r in rows} == {"forced:gpu", "finish_time", "lookahead"}
    for r in rows:
        assert abs(r["makespan_diff"]) <= TOLERANCE and r["placement_diff"] == 0.0, r
