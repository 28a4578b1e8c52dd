"""Start fast, then learn: the quick start-up measurement, its judgement, the
provisional mark, and the router's refusal of a duplicate worker id.

No model: the device is the twin's (virtual clock, exact), step statistics are
recorded by hand, and router state is built from its dataclasses.
"""

from __future__ import annotations

import io
import json
import logging
from typing import Any

import pytest

from tandem.broker.registry import TRUSTED_STEPS, Claims, WorkerState, checked_prior
from tandem.common import protocol as p
from tandem.common.steptime import StepModel, StepStats
from tandem.twin.device import TwinDevice
from tandem.workers.config import DEFAULT_DECODE_TOK_S, WorkerConfig
from tandem.workers.device_model import SimProfile
from tandem.workers.profiler import WarmUp, warm_up
from tandem.workers.rates import measured_rates
from tandem.workers.sanity import FAR, judge
from tandem.workers.startup import Progress

# Decode tok/s at batch 1-4 that three starts of a worker measured on a busy 2-core
# machine, while it then served 16-102 tok/s.
BUSY = ([0, 1, 3, 8], [2, 14, 18, 22], [1, 77, 95, 117])


def consistent(rates: dict[int, float]) -> bool:
    """Physics: more rows never lower the aggregate nor shorten a step."""
    sizes = sorted(rates)
    for i, a in enumerate(sizes):
        for b in sizes[i + 1 :]:
            if not rates[a] * (1 - 1e-9) <= rates[b] <= rates[a] * b / a * (1 + 1e-9):
                return False
    return True


@pytest.mark.parametrize("vector", BUSY[1:])
def test_one_stalled_batch_size_is_discarded_and_the_rest_kept(vector) -> None:
    verdict = judge(dict(enumerate(vector, 1)))
    assert verdict.points == {b: float(r) for b, r in enumerate(vector, 1) if b > 1}
    assert "batch 1" in verdict.notes[0] and "discarded" in verdict.notes[0]
    assert consistent(verdict.points)


def test_a_measurement_that_contradicts_itself_twice_is_rejected_whole() -> None:
    verdict = judge(dict(enumerate(BUSY[0], 1)))
    assert verdict.rejected
    assert "batch 1: 0 tok/s is no rate" in verdict.notes[0]
    assert "batch 2" in verdict.notes[1] and "contradicts itself" in verdict.notes[-1]


def test_a_point_below_its_neighbours_within_reason_is_kept() -> None:
    """Within 3x of what the others imply is left to the monotone fit: a GPU's step
    can be shorter at more rows (the H200 profile: 8 rows 17.7 ms, 16 rows 14.5 ms)."""
    assert judge({1: 50, 2: 20, 4: 120}).points == {1: 50, 2: 20, 4: 120}
    assert judge({1: 102, 8: 451, 16: 1102}).notes == []


def stats_of(rates: dict[int, float], steps: int = 6) -> WarmUp:
    """A start-up measurement that saw ``rates`` (aggregate tok/s by batch size)."""
    stats = StepStats()
    for b, rate in rates.items():
        for _ in range(steps):
            stats.record(b, 256 * b, 0, b / rate)
    return WarmUp(1.0, stats, 256)


@pytest.mark.parametrize("vector", BUSY[1:])
def test_a_worker_advertises_busy_measurements_repaired(vector, caplog) -> None:
    warm = stats_of({b: r for b, r in enumerate(vector, 1)})
    with caplog.at_level(logging.WARNING, logger="tandem.workers.rates"):
        _, decode = measured_rates(200.0, [DEFAULT_DECODE_TOK_S], warm, None, 4)
    assert consistent(dict(enumerate(decode, 1)))
    assert decode[0] >= vector[1] / 2  # batch 1 at least half of batch 2: physics, not 1 tok/s
    assert decode[1:] == pytest.approx(vector[1:], rel=0.05)
    assert "discarded" in caplog.text


def test_a_worker_falls_back_when_its_measurement_contradicts_itself(caplog) -> None:
    warm = stats_of({1: 0.4, 2: 1, 3: 3, 4: 8})  # BUSY[0], its 0 as the 0.4 it rounded
    with caplog.at_level(logging.WARNING, logger="tandem.workers.rates"):
        prefill, decode = measured_rates(200.0, [DEFAULT_DECODE_TOK_S], warm, None, 4)
    assert (prefill, decode) == (200.0, [DEFAULT_DECODE_TOK_S] * 4)
    assert "contradicts itself: not used" in caplog.text


def quick_on_twin(profile: str, max_active: int, **bounds: float) -> tuple[WarmUp, list, Any]:
    """A quick measurement of a twin device (virtual clock): it, its stages, the device."""

    class Clock:
        now = 0.0

    owner = Clock()
    device = TwinDevice(SimProfile.load(profile), owner)
    stages: list[tuple[int, int]] = []
    warm = warm_up(device, max_active, 256, context=256, measure_steps=4, compile_pass=False,
                   prefill_probe=False, progress=lambda *x: stages.append(x),
                   clock=lambda: owner.now, **bounds)  # fmt: skip
    return warm, stages, device


def test_a_quick_measurement_stops_at_its_budget_and_reports_each_stage() -> None:
    warm, stages, _ = quick_on_twin("h200-gpu", 16, budget_s=0.0)
    assert stages == [(1, 5)]  # sizes 1, 2, 4, 8, 16: the budget ended it after the first
    assert warm.stats.model().decode_batch == (1,)
    assert warm.stats.model().prefill_chunk  # the context's own prefill gave the rate
    _, decode = measured_rates(200.0, [DEFAULT_DECODE_TOK_S], warm, None, 16)
    assert len(decode) == 16 and decode == sorted(decode)


def test_a_quick_measurement_gives_up_a_batch_size_still_running_at_its_deadline() -> None:
    warm, stages, device = quick_on_twin("cpu-m2", 4, deadline_s=0.05)
    assert stages == []  # the prompt alone outlasted the deadline: nothing was finished
    assert not warm.stats.model().decode_batch
    prefill, decode = measured_rates(200.0, [DEFAULT_DECODE_TOK_S], warm, None, 4)
    assert decode == sorted(decode) and len(decode) == 4  # priced from what it has
    again = warm_up(device, 4, 256, context=256, measure_steps=4, compile_pass=False,
                    clock=lambda: device.owner.now)  # fmt: skip
    assert {1, 2, 4} <= set(again.stats.model().decode_batch)  # the device was left clean


def test_the_steps_of_a_batch_size_given_up_are_not_kept() -> None:
    """cpu-m2's twin finishes batch 1 at 3.5 s and batch 2 at 4.0 s of virtual time,
    batch 4 at 5.3 s: a 4.5 s deadline gives batch 4 up mid-way."""
    warm, stages, _ = quick_on_twin("cpu-m2", 4, deadline_s=4.5)
    assert stages == [(1, 3), (2, 3)]
    assert warm.stats.model().decode_batch == (1, 2)  # none of batch 4's few steps


def test_what_a_worker_measures_before_it_registers() -> None:
    auto = WorkerConfig(router="tcp://127.0.0.1:1")
    mlx = WorkerConfig(router="tcp://127.0.0.1:1", backend="mlx")
    assert mlx.measurement("gpu-cuda", told=True) == "full"  # kernels compile on first shapes
    # llama.cpp's GPU kernels come compiled in its build: priced like a CPU worker
    assert auto.measurement("gpu-cuda", told=True) == "none"
    assert auto.measurement("gpu-cuda", told=False) == "quick"
    assert auto.measurement("cpu", told=False) == "quick"
    assert auto.measurement("cpu", told=True) == "none"  # a profile prices it: at once
    assert auto.measurement("sim-h200-gpu", told=False) == "none"  # a sim device is its profile
    for mode, want in (("on", "full"), ("quick", "quick"), ("off", "none")):
        cfg = WorkerConfig(router="tcp://127.0.0.1:1", warmup=mode)
        assert cfg.measurement("cpu", told=True) == want
    with pytest.raises(ValueError, match="warmup"):
        WorkerConfig(router="tcp://127.0.0.1:1", warmup="sometimes")


def test_progress_lines_are_one_json_object_each_and_a_closed_reader_is_survived() -> None:
    out = io.StringIO()
    progress = Progress(True, out)
    progress("measuring", worker_id="cpu0", done=1, total=3)
    progress("registered", worker_id="cpu0", provisional=True)
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    assert lines == [{"event": "measuring", "worker_id": "cpu0", "done": 1, "total": 3},
                     {"event": "registered", "worker_id": "cpu0", "provisional": True}]  # fmt: skip
    out.close()
    progress("error", message="gone")  # no exception: the worker keeps serving
    assert not progress.enabled
    quiet = io.StringIO()
    Progress(False, quiet)("loading", worker_id="cpu0", model="m")
    assert quiet.getvalue() == ""


def ready(provisional: bool, decode: list[float]) -> p.Ready:
    return p.Ready(worker_id="cpu0", backend="llama.cpp", device="cpu", model="m", max_active=4,
                   n_ctx=4096, block_size=16, prefill_tok_s=200.0, decode_tok_s=decode,
                   heartbeat_s=0.5, tokenizer={}, instance="0123456789abcdef",
                   provisional=provisional)  # fmt: skip


def live(rates: dict[int, float], samples: int) -> StepModel:
    sizes = sorted(rates)
    return StepModel(tuple(sizes), tuple(b / rates[b] for b in sizes), (samples,) * len(sizes))


def test_a_provisional_rate_far_off_the_live_steps_does_not_survive_them() -> None:
    stalled = [2.0, 4.0, 6.0, 8.0]  # self-consistent, and 10x below what it serves
    w = WorkerState(b"x", ready(True, stalled))
    w.update_steps(live({1: 60.0, 2: 100.0}, 10).to_wire())
    priced = w.rates().decode_tok_s
    assert priced[0] == pytest.approx(60.0) and priced[1] == pytest.approx(100.0)
    assert all(x >= 100.0 / FAR for x in priced[2:])
    assert checked_prior(stalled, live({1: 60.0}, 3)) == pytest.approx([60, 120, 180, 240])
    assert checked_prior([30.0, 40.0], live({1: 60.0}, 3)) == [30.0, 40.0]  # within 3x: kept
    told = WorkerState(b"y", ready(False, stalled))  # the operator's flags: blended, not dropped
    told.update_steps(live({1: 60.0, 2: 100.0}, 10).to_wire())
    assert told.rates().decode_tok_s[0] < 60.0


def test_the_provisional_mark_holds_until_enough_served_steps() -> None:
    w = WorkerState(b"x", ready(True, [50.0] * 4))
    assert w.provisional and w.describe(True, 0.0)["provisional"]
    w.update_steps(live({1: 60.0, 2: 100.0}, TRUSTED_STEPS // 2 - 1).to_wire())
    assert w.provisional and w.live_steps == TRUSTED_STEPS - 2
    w.update_steps(live({1: 60.0, 2: 100.0}, TRUSTED_STEPS // 2).to_wire())
    assert not w.provisional and not w.describe(True, 0.0)["provisional"]
    assert not WorkerState(b"y", ready(False, [50.0] * 4)).provisional


def test_a_claim_on_a_held_id_is_refused_once_the_holder_speaks_after_it() -> None:
    holder = WorkerState(b"cpu0/aaaa", ready(False, [50.0] * 4), last_seen=10.0)
    claims = Claims()
    assert claims.refusal(b"cpu0/bbbb", holder, now=11.0) is None  # holder quiet: maybe dead
    assert claims.refusal(b"cpu0/bbbb", holder, now=12.0) is None  # still quiet: retry
    holder.last_seen = 12.5  # it heartbeats: alive, so the claimant is a duplicate
    problem = claims.refusal(b"cpu0/bbbb", holder, now=13.0)
    assert problem is not None and problem.code == p.BAD_REQUEST
    assert "'cpu0' is taken by a live worker (llama.cpp on cpu" in problem.message
    assert "instance 01234567" in problem.message and "--worker-id" in problem.message
    assert not claims.first  # answered: forgotten


def test_status_and_metrics_show_a_provisional_worker_until_its_steps_bear_it_out(h) -> None:
    """Through an in-process router: the Ready's mark, then a heartbeat whose live model
    holds enough served steps clears it in status and /metrics alike."""
    from tandem.common.transport import DealerSocket

    sock = DealerSocket(h.router.worker_sock.address, identity=b"cpu0/1")
    sock.send(p.replace(ready(True, [50.0] * 4), tokenizer=h.spec, model="m.gguf"))
    h.pump()
    assert isinstance(h.recv(sock), p.Welcome)
    h.workers["cpu0"] = sock
    gauge = "tandem_worker_provisional"
    h.heartbeat("cpu0", 1)
    assert h.core.workers["cpu0"].describe(True, 0.0)["provisional"]
    assert h.core.metrics.registry.get_sample_value(gauge, {"worker": "cpu0", "node": ""}) == 1
    h.heartbeat("cpu0", 2, steps=live({1: 60.0}, TRUSTED_STEPS).to_wire())
    assert not h.core.workers["cpu0"].describe(True, 0.0)["provisional"]
    assert h.core.metrics.registry.get_sample_value(gauge, {"worker": "cpu0", "node": ""}) == 0


def test_tandem_status_stars_a_provisional_worker_and_says_why() -> None:
    from tandem.cli.tables import workers_table

    rows = [WorkerState(b"x", ready(True, [50.0] * 4)).describe(True, 0.0)]
    settled = WorkerState(b"y", p.replace(ready(False, [50.0] * 4), worker_id="cpu1"))
    text = workers_table(p.StatusReply("phase_cost", [*rows, settled.describe(True, 0.0)]))
    assert "cpu0*" in text and "cpu1*" not in text
    assert "* cpu0: provisional: priced on start-up rates" in text
    assert "0 served decode steps so far" in text


class ColdFirstCall(TwinDevice):
    """A GPU whose first call of the process pays a one-time set-up (kernels loaded,
    handles made), as a CUDA worker's first llama_decode does."""

    device = "gpu-cuda"
    SETUP_S = 0.05

    def advance(self, cost_s: float) -> None:
        first, self.first = getattr(self, "first", True), False
        super().advance(cost_s + (self.SETUP_S if first else 0.0))


def test_a_gpus_quick_measurement_primes_first_and_measures_serving_shapes() -> None:
    from tandem.workers.profiler import WARMUP_CONTEXT
    from tandem.workers.startup import QUICK_CONTEXT, quick_shape

    assert (
        quick_shape("cpu")["context"] == QUICK_CONTEXT and not quick_shape("cpu")["prefill_probe"]
    )
    gpu = quick_shape("gpu-cuda")
    assert gpu["context"] == WARMUP_CONTEXT and gpu["primer"] and gpu["prefill_probe"]
    profile = SimProfile.load("h200-gpu")

    class Clock:
        now = 0.0

    def measured_prefill(shape: dict[str, Any]) -> float:
        owner = Clock()
        device = ColdFirstCall(profile, owner)
        shape = {**shape, "compile_pass": False}  # the primer alone
        warm = warm_up(device, 16, 256, clock=lambda: owner.now, **shape)
        rate = warm.stats.model().prefill_rate_at(256)  # what pricing reads (a full chunk)
        assert rate is not None
        return rate

    primed, cpu_shape = measured_prefill(gpu), measured_prefill(quick_shape("cpu"))
    assert primed == pytest.approx(profile.prefill_tok_s, rel=0.05)
    assert cpu_shape < 0.5 * primed  # one chunk, the process's first: the set-up priced in


class SlowAtFirst(TwinDevice):
    """A GPU that steps SLOW times slower for its first RAMP_S seconds of work (the
    H200 after a model load: the first sizes measured 1.3-1.9x slower than later)."""

    device = "gpu-cuda"
    SLOW, RAMP_S = 1.8, 0.6

    def advance(self, cost_s: float) -> None:
        self.busy_s = getattr(self, "busy_s", 0.0) + cost_s
        super().advance(cost_s * (self.SLOW if self.busy_s < self.RAMP_S else 1.0))


def test_a_gpus_quick_measurement_runs_its_ladder_untimed_first() -> None:
    from tandem.workers.profiler import step_ladder
    from tandem.workers.startup import quick_shape

    shape = quick_shape("gpu-cuda")
    assert shape["compile_pass"] and shape["ladder"] is step_ladder
    assert not quick_shape("cpu")["compile_pass"]
    profile = SimProfile.load("h200-gpu")

    class Clock:
        now = 0.0

    def measured(compile_pass: bool, kind: type[TwinDevice] = SlowAtFirst) -> dict[int, float]:
        owner = Clock()
        device = kind(profile, owner)
        warm = warm_up(device, 16, 256, clock=lambda: owner.now,
                       **{**shape, "compile_pass": compile_pass})  # fmt: skip
        return {b: r for b, (r, _) in warm.stats.model().decode_tok_s().items()}

    untimed_first, timed_at_once = measured(True), measured(False)
    assert sorted(untimed_first) == list(range(1, 17))  # every size measured
    truth = measured(False, TwinDevice)  # a device never slow
    for b, rate in truth.items():
        assert untimed_first[b] == pytest.approx(rate, rel=0.1)
    slow = [b for b in truth if timed_at_once[b] < 0.8 * truth[b]]
    assert {1, 2} <= set(slow)  # the first sizes, measured while the device was slow


def test_the_untimed_pass_keeps_the_quick_budget_too() -> None:
    """A GPU slow enough that its ladder outlasts the budget (a 7B model's steps):
    the untimed pass stops starting sizes past it, as the timed one does."""
    from tandem.workers.startup import QUICK_BUDGET_S, QUICK_DEADLINE_S, quick_shape

    class Slow(TwinDevice):
        device = "gpu-cuda"

        def advance(self, cost_s: float) -> None:
            super().advance(cost_s * 5)

    class Clock:
        now = 0.0

    owner = Clock()
    device = Slow(SimProfile.load("h200-gpu"), owner)
    warm = warm_up(device, 16, 256, clock=lambda: owner.now, budget_s=QUICK_BUDGET_S,
                   deadline_s=QUICK_DEADLINE_S, **quick_shape("gpu-cuda"))  # fmt: skip
    assert warm.seconds < 2 * QUICK_DEADLINE_S
    assert {1, 2, 4} <= set(warm.stats.model().decode_tok_s())
