"""When a worker's step-time model rides a heartbeat (workers/steptimer.py)."""

from __future__ import annotations

import pytest

from tandem.common.steptime import StepModel
from tandem.workers.steptimer import MOVE_CHECK_S, StepTimer


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def steps(timer: StepTimer, clock: Clock, n: int, seconds: float) -> None:
    for _ in range(n):
        timer.start(4, 400, 0)
        clock.now += seconds
    timer.stop()


def test_a_moved_estimate_is_sent_before_every_s_small_changes_wait() -> None:
    clock = Clock()
    timer = StepTimer(every_s=1.0, resend_s=30.0, clock=clock)
    steps(timer, clock, 40, 0.010)
    (first,) = StepModel.from_wire(timer.report()).decode_step_s
    assert first == pytest.approx(0.010)
    sent_at = clock.now
    clock.now += MOVE_CHECK_S
    steps(timer, clock, 2, 0.011)  # 10 % slower for a moment: not news
    assert timer.report() is None
    clock.now += MOVE_CHECK_S
    steps(timer, clock, 20, 0.016)  # the device slowed 1.6x: news within every_s
    assert clock.now - sent_at < timer.every_s
    moved = timer.report()
    assert moved is not None
    (step,) = StepModel.from_wire(moved).decode_step_s
    assert step > 0.012


def test_the_moved_check_runs_at_most_every_move_check_s() -> None:
    clock = Clock()
    timer = StepTimer(every_s=10.0, resend_s=30.0, clock=clock)
    steps(timer, clock, 40, 0.010)
    assert timer.report() is not None
    timer._checked_at = clock.now  # a check just ran
    steps(timer, clock, 30, 0.002)  # 60 ms of much faster steps: too soon to look
    assert clock.now - timer._checked_at < MOVE_CHECK_S
    assert timer.report() is None
    clock.now += MOVE_CHECK_S
    timer.start(4, 400, 0)
    clock.now += 0.002
    timer.stop()
    assert timer.report() is not None


def test_a_trace_holds_every_recorded_step_as_it_was_timed(tmp_path, monkeypatch) -> None:
    import tandem.workers.steptimer as steptimer

    clock = Clock()
    timer = StepTimer(every_s=1.0, resend_s=30.0, clock=clock)
    path = tmp_path / "gpu.csv"
    timer.trace_to(path)
    timer.start(16, 516, 0)
    clock.now += 0.002
    with timer.per_request():  # one request's admission: left out of the step
        clock.now += 0.003
    clock.now += 0.005
    timer.start(16, 517, 0)  # the period ends where the next step starts
    clock.now += 0.014
    timer.stop()
    header, *rows = path.read_text().splitlines()
    assert header.split(",") == ["start_s", "batch", "context_tokens", "prefill_tokens",
                                 "seconds", "excluded_s"]  # fmt: skip
    parsed = [[float(x) for x in row.split(",")] for row in rows]
    assert parsed[0] == pytest.approx([0.0, 16, 516, 0, 0.007, 0.003])
    assert parsed[1] == pytest.approx([0.010, 16, 517, 0, 0.014, 0.0])
    # The same seconds went to the model the router is sent.
    assert [x for x, _ in timer.stats.decode[16].samples] == pytest.approx([0.007, 0.014])

    monkeypatch.setattr(steptimer, "TRACE_MAX_STEPS", 3)
    timer.trace_to(path)
    steps(timer, clock, 5, 0.010)
    assert len(path.read_text().splitlines()) == 1 + 3  # bounded: then the file is closed
    assert timer._trace is None


def test_a_trace_that_cannot_be_written_ends_quietly(tmp_path) -> None:
    class FullDisk:
        def write(self, _: str) -> int:
            raise OSError(28, "No space left on device")

    clock = Clock()
    timer = StepTimer(every_s=1.0, resend_s=30.0, clock=clock)
    timer._trace = FullDisk()  # type: ignore[assignment]
    steps(timer, clock, 3, 0.010)  # the steps are still timed and modelled
    assert timer._trace is None
    assert len(timer.stats.decode[4].samples) == 3
