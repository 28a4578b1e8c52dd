"""A worker measures itself at start and advertises the measurement, not what it is told.

The device here is the twin's (twin/device.py): the sim profile's step costs on a
virtual clock, so the measurement is exact and the test deterministic.
"""

from __future__ import annotations

import dataclasses
import logging
import random

import pytest

from tandem.common import protocol as p
from tandem.twin.device import Tail, TwinDevice
from tandem.workers.config import EngineConfig
from tandem.workers.device_model import SimProfile
from tandem.workers.engine import Engine
from tandem.workers.profiler import warm_up
from tandem.workers.rates import measured_rates

GPU_ACTIVE = 16


class Clock:
    now = 0.0


@pytest.fixture(scope="module")
def gpu():
    profile = SimProfile.load("h200-gpu")
    owner = Clock()
    device = TwinDevice(profile, owner)
    warm = warm_up(device, GPU_ACTIVE, 256, compile_pass=False, clock=lambda: owner.now)
    return profile, warm


def truth(profile: SimProfile) -> list[float]:
    return list(profile.decode_tok_s()[:GPU_ACTIVE])


def test_the_warm_up_measures_every_power_of_two_batch_and_the_prefill_rate(gpu) -> None:
    profile, warm = gpu
    model = warm.stats.model()
    assert {1, 2, 4, 8, 16} <= set(model.decode_batch)
    assert warm.context == 512 and warm.seconds > 0
    rates = model.decode_tok_s()
    for b in (1, 2, 4, 8, 16):
        assert rates[b][0] == pytest.approx(profile.decode_tok_s()[b - 1], rel=0.02)
        assert rates[b][1] >= 8  # each size's median stands on 8 measured steps or more
    assert max(model.prefill_tok_s) == pytest.approx(profile.prefill_tok_s, rel=0.02)


def test_an_outlier_in_the_profile_is_replaced_by_the_measurement_and_named(gpu, caplog) -> None:
    profile, warm = gpu
    told = truth(profile)
    told[1] = 11.0  # the H200's profile once said 11 tok/s at batch 2 (a stall)
    with caplog.at_level(logging.WARNING, logger="tandem.workers.rates"):
        _, decode = measured_rates(profile.prefill_tok_s, told, warm, "the profile", GPU_ACTIVE)
    assert decode[1] == pytest.approx(profile.decode_tok_s()[1], rel=0.02)
    assert "batch 2: 11 -> 18" in caplog.text and "the profile disagrees" in caplog.text


def test_an_unprofiled_worker_advertises_what_it_measured_not_the_default_guess(gpu) -> None:
    profile, warm = gpu
    prefill, decode = measured_rates(200.0, [50.0], warm, None, GPU_ACTIVE)
    assert prefill == pytest.approx(profile.prefill_tok_s, rel=0.02)
    assert len(decode) == GPU_ACTIVE
    for b in (1, 2, 4, 8, 16):  # measured sizes: the measurement (pooled where it dips)
        assert decode[b - 1] == pytest.approx(truth(profile)[b - 1], rel=0.05)
    assert decode == sorted(decode)  # and a monotone table between them


def test_understated_batch_scaling_is_corrected_at_the_measured_sizes(gpu) -> None:
    profile, warm = gpu
    real = truth(profile)
    told = [real[0] * (1 + (d / real[0] - 1) / 2) for d in real]  # half the batching gain
    _, decode = measured_rates(profile.prefill_tok_s, told, warm, "the profile", GPU_ACTIVE)
    assert decode[15] == pytest.approx(real[15], rel=0.08)
    assert decode[15] > 1.5 * told[15]


def test_the_serving_engine_reports_the_warm_up_in_its_first_heartbeat(gpu) -> None:
    _, warm = gpu
    out: list[p.Message] = []
    owner = Clock()
    engine = Engine(TwinDevice(SimProfile.load("h200-gpu"), owner), EngineConfig(), out.append,
                    "gpu", clock=lambda: owner.now)  # fmt: skip
    engine.timer.adopt(warm.stats)
    engine.maybe_heartbeat()
    beat = next(m for m in out if isinstance(m, p.Heartbeat))
    assert beat.steps is not None and 16 in beat.steps.decode_batch


def test_a_skewed_device_is_measured_at_what_a_run_of_its_steps_takes() -> None:
    """Every 5th step 2x (the H200 GPU's slow tenth ran 1.4-2.7x its median): the
    warm-up prices each batch size within 10 % of a steady device as fast over a
    run of steps (medians priced it 1/1.2 of that), and finds no context slope in
    a skew that only happens to line up with context."""
    profile = SimProfile.load("h200-gpu")
    tail = Tail(every=5, x=2.0)
    owner = Clock()
    device = TwinDevice(profile, owner, tail=tail)
    warm = warm_up(device, GPU_ACTIVE, 256, compile_pass=False, clock=lambda: owner.now)
    model = warm.stats.model()
    steady = tail.steady(profile)
    assert model.context_s == 0.0
    for b, step in zip(model.decode_batch, model.decode_step_s, strict=True):
        assert step == pytest.approx(steady.step_s(b), rel=0.10), b


def test_a_device_that_slows_with_context_is_measured_with_its_slope() -> None:
    """A CPU whose decode step grows 4.8 us per context token per row (llama.cpp on the
    H200 box decoded ~2x slower after 516 tokens than after 16) serves prompts of 64 to
    2,048 tokens: the worker's live model finds the slope and quotes each batch size's
    step at its median context as the device costs it there."""
    k = 4.8e-6
    profile = dataclasses.replace(SimProfile.load("h200-cpu"), decode_context_s=k)
    owner = Clock()
    engine = Engine(TwinDevice(profile, owner), EngineConfig(max_active=4), lambda m: None,
                    "cpu", clock=lambda: owner.now)  # fmt: skip
    rng = random.Random(0)
    for i in range(24):
        n = rng.choice([64, 256, 1024, 2048])
        prompt = [1000 + (i * 131 + j) % 3000 for j in range(n)]
        engine.handle(p.Assign(f"r{i}", prompt, p.SamplingParams(max_tokens=64)))
    while engine.queue or engine.active:
        engine.step()
    model = engine.timer.stats.model()
    assert model.context_s == pytest.approx(k, rel=0.05)
    assert model.context > 500  # quoted where the rows decoded, not at an empty context
    for b, step in zip(model.decode_batch, model.decode_step_s, strict=True):
        assert step == pytest.approx(profile.step_s(b) + k * b * model.context, rel=0.02), b
