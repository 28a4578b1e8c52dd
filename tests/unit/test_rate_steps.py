"""A measured step down in decode rate (llama.cpp's CUDA kernels past 8 rows): the
GPU's start-up ladder finds it, the fit keeps it, the Ready carries it to the router."""

from __future__ import annotations

import msgspec
import pytest

from tandem.common import protocol as p
from tandem.common.pricing import price
from tandem.common.ratefit import fit_decode_rates, measured_drops
from tandem.common.steptime import StepModel
from tandem.workers.profiler import step_ladder

# The H200's llama.cpp GPU worker, step ms by rows (prices-hold's step trace: 4.07 at 8,
# 6.08 at 9, 8.63 at 16; the rest as a kernel change looks: rising again from 9).
STEP_MS = {1: 1.2, 2: 1.4, 4: 1.8, 8: 4.07, 9: 6.08, 12: 6.9, 16: 8.63}


def _points(step_ms: dict[int, float], samples: int = 8) -> dict[int, tuple[float, int]]:
    return {b: (b / (ms / 1e3), samples) for b, ms in step_ms.items()}


def _model(step_ms: dict[int, float], samples: int = 8) -> StepModel:
    sizes = sorted(step_ms)
    return StepModel(tuple(sizes), tuple(step_ms[b] / 1e3 for b in sizes), (samples,) * len(sizes))


def test_the_gpu_ladder_measures_every_size_to_16_powers_of_two_first() -> None:
    assert step_ladder(16)[:5] == [1, 2, 4, 8, 16]
    assert sorted(step_ladder(16)) == list(range(1, 17))
    assert step_ladder(4) == [1, 2, 4, 3] and step_ladder(1) == [1]
    wide = step_ladder(64)
    assert wide[:7] == [1, 2, 4, 8, 16, 32, 64] and {17, 33} <= set(wide) and 34 not in wide
    assert len(wide) == len(set(wide)) and max(wide) == 64


def test_a_kernel_step_is_a_measured_drop_and_a_stall_is_not() -> None:
    assert measured_drops(_points(STEP_MS)) == (9,)
    stall = {**STEP_MS, 9: 6.08, 12: 4.5, 16: 5.0}  # the level comes back after 9
    assert measured_drops(_points(stall)) == ()
    assert measured_drops(_points(STEP_MS, samples=2)) == ()  # too few steps to tell
    gap = {b: ms for b, ms in STEP_MS.items() if b != 8}  # 4 -> 9: not adjacent sizes
    assert measured_drops(_points(gap)) == ()
    last = {b: ms for b, ms in STEP_MS.items() if b <= 9}  # nothing after 9 confirms it
    assert measured_drops(_points(last)) == ()


def test_the_fit_keeps_a_told_step_and_smooths_the_rest() -> None:
    table = [b / (ms / 1e3) for b, ms in sorted(STEP_MS.items())]  # sizes 1,2,4,8,9,12,16
    smooth = fit_decode_rates(table)
    assert list(smooth.rates) == sorted(smooth.rates) and smooth.steps == ()
    kept = fit_decode_rates(table, steps=[5])  # index 4 holds batch 9 here: size 5 of 7
    assert kept.steps == (5,) and kept.rates[4] == pytest.approx(table[4])
    assert kept.rates[4] < 0.8 * kept.rates[3]
    assert list(kept.rates[:4]) == sorted(kept.rates[:4])
    assert list(kept.rates[4:]) == sorted(kept.rates[4:])
    rising = [100.0, 150.0, 200.0]  # a told step where the rates do not drop: ignored
    assert fit_decode_rates(rising, steps=[2]).steps == ()


def test_the_price_keeps_the_drop_from_live_steps_or_from_the_ready() -> None:
    flat = [2000.0] * 16
    served = _model(STEP_MS, samples=200)  # outweighs the prior
    live = price(1000.0, flat, 16, served, find_steps=True)  # a GPU pricing its start
    assert live.steps == (9,)
    router = price(1000.0, flat, 16, served).decode_tok_s  # served steps alone: smoothed
    assert list(router) == sorted(router)
    r = live.decode_tok_s
    assert r[8] < 0.8 * r[7]  # batch 9 below batch 8, as served
    assert r[8] == pytest.approx(9 / 6.08e-3, rel=0.1)
    # The router before any served step: the Ready's table and its steps.
    told = list(r)
    assert price(1000.0, told, 16, steps=[9]).decode_tok_s[8] == pytest.approx(r[8])
    smoothed = price(1000.0, told, 16).decode_tok_s  # not told: the old monotone fit
    assert smoothed[8] >= smoothed[7] * (1 - 1e-9)


def test_the_ready_bounds_its_steps() -> None:
    base = p.Ready(worker_id="w", backend="sim", device="gpu", model="m", max_active=16,
                   n_ctx=4096, block_size=16, prefill_tok_s=1000.0, decode_tok_s=[10.0],
                   heartbeat_s=1.0, tokenizer={})  # fmt: skip
    assert base.decode_steps == []
    wire = msgspec.msgpack.encode(msgspec.structs.replace(base, decode_steps=[9]))
    assert msgspec.msgpack.decode(wire, type=p.Ready).decode_steps == [9]
    for bad in ([1], [0], [10**6], list(range(2, 10**4))):
        wire = msgspec.msgpack.encode(msgspec.structs.replace(base, decode_steps=bad))
        with pytest.raises(msgspec.ValidationError):
            msgspec.msgpack.decode(wire, type=p.Ready)


def test_only_a_gpu_keeps_a_step_its_start_up_measured() -> None:
    from tandem.common.steptime import StepStats
    from tandem.workers.profiler import WarmUp
    from tandem.workers.rates import measured_rates, measured_steps

    # The H200's llama.cpp GPU step ms at 1-16 rows, in isolation (studies/held_cells.py)
    isolated = [1.19, 1.48, 1.78, 1.94, 2.13, 2.27, 2.43, 2.69,
                4.13, 4.39, 4.64, 4.72, 4.92, 5.07, 5.26, 5.35]  # fmt: skip
    stats = StepStats()
    for b, ms in enumerate(isolated, 1):  # every size the GPU ladder times
        for _ in range(8):
            stats.record(b, 512 * b, 0, ms / 1e3)
    warm = WarmUp(1.0, stats, 512)
    _, gpu = measured_rates(1000.0, [100.0], warm, None, 16, find_steps=True)
    assert measured_steps(warm, 16) == (9,) and gpu[8] < 0.8 * gpu[7]
    _, cpu = measured_rates(1000.0, [100.0], warm, None, 16)  # a CPU: smoothed, as before
    assert cpu == sorted(cpu)
