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
