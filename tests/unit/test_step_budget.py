"""Step budgets in time: prompt chunks beside decode rows sized from the step model."""

from __future__ import annotations

import pytest

from tandem.common.protocol import SamplingParams
from tandem.common.schedule import plan_step
from tandem.common.steptime import StepModel, StepStats
from tandem.workers.engine import Engine, EngineConfig
from tandem.workers.request import Request
from tests.helpers import FakeBackend


def model(decode_s=0.02, rates=None) -> StepModel:
    """Decode steps of ``decode_s`` at batch 1..4; prefill tok/s by chunk bucket."""
    rates = rates if rates is not None else {16: 400.0, 64: 200.0, 256: 100.0}
    return StepModel(
        decode_batch=(1, 2, 4),
        decode_step_s=(decode_s, decode_s * 1.2, decode_s * 1.5),
        decode_samples=(10, 10, 10),
        prefill_chunk=tuple(rates),
        prefill_tok_s=tuple(rates.values()),
        prefill_samples=tuple(10 for _ in rates),
    )


def test_a_chunk_fits_the_time_left_beside_the_decode_rows():
    # batch 1: 20 ms a step, factor 3 -> 40 ms of prompt: 16 tokens at 400 tok/s fit,
    # 64 at 200 tok/s (0.32 s) do not; the 16-bucket's rate prices 16 tokens.
    assert model().prefill_budget(1, 3.0, 256, 1) == 16
    # batch 4 steps take 30 ms: 60 ms at 400 tok/s is 24 tokens, priced by the 16-bucket
    # (a 24-token chunk lands in bucket 32, unmeasured: the rate below it is used).
    assert model().prefill_budget(4, 3.0, 256, 1) == 24
    # batch 3 has no estimate of its own: batch 4's (no faster with more rows).
    assert model().prefill_budget(3, 3.0, 256, 1) == 24


def test_the_chunk_stays_within_the_target_at_its_own_bucket_rate():
    for decode_s in (0.005, 0.02, 0.05, 0.2, 1.0):
        for factor in (1.5, 2.0, 3.0, 10.0):
            m = model(decode_s)
            n = m.prefill_budget(2, factor, 4096, 1)
            rate = m.prefill_rate_at(n)
            assert rate is not None
            if n < 4096:
                step_s = m.decode_step_at(2) + n / rate
                assert step_s <= factor * m.decode_step_at(2) * (1 + 1e-9)


def test_budget_falls_back_to_the_cap_until_measured_and_never_below_the_floor():
    assert StepModel().prefill_budget(1, 3.0, 256, 16) == 256  # nothing measured yet
    only_decode = model(rates={})
    assert only_decode.prefill_budget(1, 3.0, 256, 16) == 256
    slow = model(decode_s=0.001, rates={256: 10.0})  # 2 ms at 10 tok/s: 0 tokens fit
    assert slow.prefill_budget(1, 3.0, 256, 16) == 16
    assert slow.prefill_budget(1, 3.0, 8, 16) == 8  # the floor never beats the cap


def test_plan_caps_prompt_tokens_only_beside_decode_rows():
    class Row:
        def __init__(self, decoding, left):
            self.decoding, self.prefill_remaining = decoding, left

    d, a = Row(True, 0), Row(False, 500)
    plan = plan_step([d, a], 256, chunk_cap=24)
    assert plan.decode == [d] and plan.prefill == [(a, 24)]
    alone = plan_step([a], 256, chunk_cap=24)  # nothing decodes: the token budget
    assert alone.prefill == [(a, 256)]


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_engine_chunks_a_long_prompt_beside_a_decoding_stream():
    clock = Clock()
    backend = FakeBackend()
    cfg = EngineConfig(max_active=2, step_tokens=256, step_budget_x=3.0, min_chunk_tokens=8)
    engine = Engine(backend, cfg, lambda m: None, "w0", clock=clock)
    stats = StepStats()  # what the worker measured: 20 ms decode steps, 400 tok/s chunks
    for _ in range(12):
        stats.record(1, 100, 0, 0.02)
        stats.record(0, 0, 16, 16 / 400)
    engine.timer.adopt(stats)
    engine.submit(Request("d", list(range(1, 9)), SamplingParams(max_tokens=50)))
    engine.step()  # d: prompt in one step, now decoding
    engine.submit(Request("long", list(range(1, 501)), SamplingParams(max_tokens=2)))
    engine.step()
    chunks = [n for _, prefill in backend.steps[1:] for rid, n in prefill if rid == "long"]
    assert chunks == [16]  # 40 ms beside a 20 ms decode step at 400 tok/s
    engine.cfg = EngineConfig(max_active=2, step_tokens=256, step_budget_x=0)  # off: tokens
    engine.step()
    assert backend.steps[-1][1] == [("long", 255)]


@pytest.mark.parametrize("x", [-1.0, 0.5, 1.0, 1001.0])
def test_budget_factor_is_validated(x):
    with pytest.raises(ValueError, match="step_budget_x"):
        EngineConfig(step_budget_x=x)


def sharing_engine() -> tuple[Engine, FakeBackend, list]:
    backend, out = FakeBackend(), []
    cfg = EngineConfig(max_active=4, step_tokens=64, block_size=16, step_budget_x=0)
    return Engine(backend, cfg, out.append, "w0"), backend, out


def done_stats(out: list) -> dict:
    return {m.request_id: m.stats for m in out if hasattr(m, "stats")}


def test_a_burst_sharing_a_prefix_computes_it_once():
    engine, backend, out = sharing_engine()
    shared = list(range(1, 401))
    for i in range(4):  # sent together: none is cached, all share 400 tokens
        engine.submit(Request(f"r{i}", shared + [500 + i] * 20, SamplingParams(max_tokens=3)))
    while engine.queue or engine.active:
        engine.step()
    stats = done_stats(out)
    assert stats["r0"].cached_tokens == 0
    assert [stats[f"r{i}"].cached_tokens for i in (1, 2, 3)] == [400, 400, 400]
    assert backend.fed == 420 + 3 * 20  # the prefix once, each request's own tail


def test_a_request_waiting_for_a_prefix_goes_on_when_its_leader_is_cancelled():
    engine, backend, out = sharing_engine()
    shared = list(range(1, 401))
    engine.submit(Request("lead", shared + [7], SamplingParams(max_tokens=3)))
    engine.submit(Request("next", shared + [8], SamplingParams(max_tokens=3)))
    engine.step()
    assert [r.id for r in engine.queue] == ["next"]  # waits: the prefix is being computed
    engine.cancel("lead")
    while engine.queue or engine.active:
        engine.step()
    stats = done_stats(out)
    assert stats["next"].output_tokens == 3
    assert stats["next"].cached_tokens == 64  # the leader's one chunk, kept by the cache


def test_a_budget_without_rates_follows_the_first_samples_at_once():
    from tandem.workers.steptimer import StepTimer

    timer = StepTimer(1.0, 30.0, clock=lambda: 0.0)  # the clock never moves: no refresh due
    assert timer.chunk_cap(1, 3.0, 256, 8) == 256  # nothing measured: the token budget
    for _ in range(12):
        timer.stats.record(1, 100, 0, 0.02)
        timer.stats.record(0, 0, 16, 16 / 400)
    assert timer.chunk_cap(1, 3.0, 256, 8) == 16  # rebuilt on the new samples
