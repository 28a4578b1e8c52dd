"""The shared schedule rules and the finish-time predictor, checked against the real engine.

The predictor replays common/schedule.py forward from a worker's view; the
engine runs the same rules step by step. On a twin worker (the real Engine over
a virtual-clock device) the predicted finish of a new request must equal when
the engine really finishes it, whatever the state it joins.
"""

from __future__ import annotations

import random

import pytest

from tandem.broker.policies import FinishTime, Load, RouteRequest, WorkerView, parse_policy
from tandem.broker.policies.finish import predict_finish_s
from tandem.common import protocol as p
from tandem.common.protocol import SamplingParams
from tandem.common.schedule import decode_segments, plan_step, repeats
from tandem.twin.world import NO_DELAY, TwinWorker, World
from tandem.workers.device_model import SimProfile
from tandem.workers.engine import EngineConfig
from tandem.workers.request import Request

GPU = SimProfile("gpu", 2551.0, tuple(0.003413 * (1 + 0.1 * b) for b in range(8)))


class Row:
    def __init__(self, prefill: int, decoding: bool = False) -> None:
        self.prefill_remaining = prefill
        self.decoding = decoding


def test_plan_step_feeds_decodes_first_then_prefill_chunks_in_order():
    rows = [Row(0, True), Row(100), Row(0, True), Row(50)]
    plan = plan_step(rows, 64)
    assert plan.decode == [rows[0], rows[2]]
    assert plan.prefill == [(rows[1], 62)]
    assert plan.prefill_tokens == 62
    assert repeats(plan, [9, 4]) == 1  # 100 // 62: one full chunk, then a shorter one


def test_repeats_until_the_first_end():
    rows = [Row(0, True), Row(0, True)]
    assert repeats(plan_step(rows, 8), [7, 3]) == 3
    rows = [Row(0, True), Row(40)]
    assert repeats(plan_step(rows, 11), [30]) == 4  # 10-token chunks: the 4th ends the prefill


def test_decode_segments_shrink_the_batch_at_each_end():
    assert decode_segments([2, 5, 9], 5) == [(2, 4), (3, 3)]
    assert decode_segments([], 3) == [(3, 1)]


def _twin(max_active: int, step_tokens: int, device: SimProfile = GPU) -> tuple[World, TwinWorker]:
    world = World()
    # The predictor plans by the token budget; the worker's time budget (step_budget_x)
    # sizes chunks from its own live step model, which the router does not replay.
    cfg = EngineConfig(
        max_active=max_active, step_tokens=step_tokens, cache_tokens=0, step_budget_x=0
    )
    return world, TwinWorker(world, "w", device, cfg, lambda wid, msgs: None, NO_DELAY)


def _view(w: TwinWorker, max_active: int, step_tokens: int) -> WorkerView:
    e = w.engine
    return WorkerView(
        "w",
        GPU.prefill_tok_s,
        tuple(GPU.decode_tok_s()),
        max_active,
        active=tuple(Load(r.prefill_remaining, r.decode_remaining) for r in e.active),
        queued=tuple(Load(r.prefill_remaining, r.decode_remaining) for r in e.queue),
        step_tokens=step_tokens,
    )


@pytest.mark.parametrize("seed", range(40))
def test_prediction_equals_what_the_engine_does(seed):
    rng = random.Random(seed)
    max_active, step_tokens = rng.choice([1, 3, 8]), rng.choice([16, 64, 256])
    step_tokens = max(step_tokens, max_active)
    world, w = _twin(max_active, step_tokens)
    for i in range(rng.randint(0, 14)):
        prompt = [1000 + i] * rng.randint(1, 600)
        w.engine.submit(
            Request(f"r{i}", prompt, SamplingParams(max_tokens=rng.randint(1, 60), ignore_eos=True))
        )
    for _ in range(rng.randint(0, 30)):  # some steps in: a mix of prefills, decodes, a queue
        if w.engine.queue or w.engine.active:
            w.engine.step()
    new = RouteRequest(rng.randint(1, 700), rng.randint(1, 80))
    predicted = predict_finish_s(new, _view(w, max_active, step_tokens))
    start = w.now
    w.engine.submit(
        Request(
            "new",
            [7] * new.prompt_tokens,
            SamplingParams(max_tokens=new.max_tokens, ignore_eos=True),
        )
    )
    while not any(isinstance(m, p.Done) and m.request_id == "new" for m in w._out):
        w.engine.step()
    assert w.now - start == pytest.approx(predicted, rel=1e-9, abs=1e-9)


def test_memoized_drains_give_the_same_scores():
    """The policy memoizes the drain ahead of a new request per view; the cached
    prefix of the new prompt is not part of it, so two prompts share one drain."""
    base = WorkerView("gpu", 2551.0, tuple(GPU.decode_tok_s()), 4,
                      active=(Load(0, 50), Load(30, 80)), queued=(Load(200, 40),) * 3)  # fmt: skip
    policy = FinishTime()
    for cached in (0, 64, 512, 0):
        view = base.replace(cached_tokens=cached)
        req = RouteRequest(516, 128)
        assert policy.choose(req, [view]).scores["gpu"] == predict_finish_s(req, view)


def test_answers_kept_on_a_view_are_what_a_fresh_prediction_says():
    """Each view keeps its drain and its answers by (uncached prompt, budget); copies
    for other cached prefixes share them. Over random loads, prompts and budgets, every
    memoized score equals a prediction made from scratch, and a changed worker (a new
    view) is never answered from the old one's memo."""
    rng = random.Random(7)
    policy = FinishTime()
    views = []
    for i in range(6):
        loads = tuple(Load(rng.choice([0, 0, 40, 300]), rng.randint(1, 120)) for _ in range(5))
        views.append(WorkerView(f"w{i}", 2551.0, tuple(GPU.decode_tok_s()), 4,
                                active=loads[:3], queued=loads[3:]))  # fmt: skip
    for _ in range(200):
        req = RouteRequest(rng.choice([100, 516]), rng.choice([16, 128]))
        offered = [v.with_cached(rng.choice([0, 0, 64, 512])) for v in views]
        decision = policy.choose(req, offered)
        exact = {v.id: predict_finish_s(req, v) for v in offered}
        assert {k: x for k, x in decision.scores.items() if k not in decision.pruned} == {
            k: x for k, x in exact.items() if k not in decision.pruned
        }
        assert all(decision.scores[k] <= exact[k] for k in decision.pruned)
        if rng.random() < 0.2:  # a worker changed: the router builds a new view
            k = rng.randrange(len(views))
            old = views[k]
            views[k] = WorkerView(old.id, 2551.0, old.decode_rates, 4,
                                  active=old.active + (Load(0, 9),), queued=old.queued)  # fmt: skip
    shared = views[0].with_cached(64)
    policy.choose(RouteRequest(516, 16), [shared])
    assert views[0].memo is shared.memo and "finish_time" in views[0].memo


def test_adding_to_a_busy_gpu_costs_its_real_batch_step():
    """A GPU at batch 8 (its cap) makes a new request wait for a slot; a ninth row is
    not priced at the batch-8 rate as if it came for free."""
    busy = WorkerView("gpu", 2551.0, tuple(GPU.decode_tok_s()), 8, active=(Load(0, 100),) * 8)
    idle = WorkerView("gpu", 2551.0, tuple(GPU.decode_tok_s()), 8)
    req = RouteRequest(16, 100)
    wait_for_slot = 100 * GPU.step_s(8)
    alone = 16 / 2551.0 + 99 * GPU.step_s(1)  # its prefill step, then 99 decodes alone
    assert predict_finish_s(req, idle) == pytest.approx(16 / 2551.0 + 99 * GPU.step_s(1))
    assert predict_finish_s(req, busy) == pytest.approx(wait_for_slot + alone)


def test_finish_time_is_a_named_policy_that_prefers_the_earlier_finish():
    assert parse_policy("finish_time").name == "finish_time"
    cpu = WorkerView("cpu", 73.0, (45.0, 58.0), 2, cached_tokens=512)
    gpu = WorkerView("gpu", 2551.0, (293.0, 533.0), 2, cached_tokens=512,
                     active=(Load(0, 120), Load(0, 120)), queued=(Load(4, 128),) * 12)  # fmt: skip
    req = RouteRequest(516, 128)
    assert FinishTime().choose(req, [cpu, gpu]).worker_id == "cpu"
    assert (
        FinishTime().choose(req, [cpu, WorkerView("gpu", 2551.0, (293.0, 533.0), 2)]).worker_id
        == "gpu"
    )


@pytest.mark.parametrize("prompt", [16, 300, 1200, 4000])
def test_a_request_is_priced_at_its_own_context_on_a_device_that_slows_with_it(prompt):
    """A device whose decode step grows 20 us per context token per row, quoted (as a
    live step model quotes it) at 1,000 tokens of context per row: a new request joining
    two rows decoding at exactly that context finishes when the prediction says, short
    prompts sooner than the quoted steps and long ones later. Blind to context, the
    prediction would be off by the sum of its rows' extra context."""
    k, c, others = 2e-5, 1000, 2
    device = SimProfile("gpu", 2551.0, GPU.decode_step_s, decode_context_s=k)
    _, w = _twin(4, 64, device)
    for i in range(others):
        r = Request(f"r{i}", [1000 + i] * c, SamplingParams(max_tokens=400, ignore_eos=True))
        w.engine.submit(r)
    while any(not r.decoding for r in w.engine.active) or w.engine.queue:
        w.engine.step()
    held = {r.id for r in w.engine.active}  # kept at c, the view's quoted context, so
    for r in w.engine.active:  # that only the new row is off it (their n_fed reset each step)
        r.n_fed = 0
    quoted = tuple(b / (device.step_s(b) + k * b * c) for b in range(1, 5))
    rows = tuple(Load(0, r.decode_remaining) for r in w.engine.active)
    view = WorkerView("w", 2551.0, quoted, 4, step_tokens=64, decode_context=c,
                      decode_context_s=k, active=rows)  # fmt: skip
    new = RouteRequest(prompt, 40)
    predicted = predict_finish_s(new, view)
    blind = predict_finish_s(new, view.replace(decode_context_s=0.0))
    start = w.now
    w.engine.submit(Request("new", [7] * prompt, SamplingParams(max_tokens=40, ignore_eos=True)))
    while not any(isinstance(m, p.Done) and m.request_id == "new" for m in w._out):
        for r in w.engine.active:
            if r.id in held:
                r.n_fed = 0
        w.engine.step()
    assert w.now - start == pytest.approx(predicted, rel=1e-9)
    assert predicted - blind == pytest.approx(k * (39 * (prompt - c) + 39 * 38 / 2))


def test_a_slope_steeper_than_the_steps_it_explains_is_held_to_them():
    """A worker's slope of 1e-3 s per context token per row, quoted at 500 tokens with a
    batch-1 step of ~3.8 ms, says one row's context costs 0.5 s of a 3.8 ms step: it is
    priced as the steepest slope those steps allow (the whole step context), so a long
    prompt costs what a linear step would and a short one never less than nothing."""
    rates = tuple(GPU.decode_tok_s())
    steep = WorkerView("w", 2551.0, rates, 8, decode_context=500.0, decode_context_s=1e-3)
    most = WorkerView("w", 2551.0, rates, 8, decode_context=500.0,
                      decode_context_s=GPU.step_s(1) / 500)  # fmt: skip
    flat = WorkerView("w", 2551.0, rates, 8)
    long, short = RouteRequest(2000, 64), RouteRequest(16, 64)
    assert predict_finish_s(long, steep) == pytest.approx(predict_finish_s(long, most))
    alone = predict_finish_s(long, flat)
    assert predict_finish_s(long, steep) == pytest.approx(
        alone + GPU.step_s(1) / 500 * (63 * 1500 + 63 * 62 / 2)
    )
    assert 0 < predict_finish_s(short, steep) < predict_finish_s(short, flat)
    # No context measured (quoted at 0): a slope alone prices nothing.
    unquoted = WorkerView("w", 2551.0, rates, 8, decode_context_s=1e-3)
    assert predict_finish_s(long, unquoted) == alone
