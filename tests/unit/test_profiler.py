"""``tandem profile``'s measurement: repeats, medians, spread, and the repair of bad points."""

from __future__ import annotations

import time

import pytest

from tandem.workers.profiler import profile_backend
from tests.helpers import FakeBackend


class TimedBackend(FakeBackend):
    """FakeBackend on a fake clock: a step costs 10 ms + 1 ms per decode row, and
    ``stalls`` maps a decode batch size to extra seconds for its next steps."""

    def __init__(self, clock: list[float], stalls: dict[int, list[float]]) -> None:
        super().__init__()
        self.clock, self.stalls = clock, stalls

    def run(self, decode, prefill):
        extra = self.stalls.get(len(decode)) if not prefill else None
        self.clock[0] += 0.010 + 0.001 * len(decode) + (extra.pop(0) if extra else 0.0)
        return super().run(decode, prefill)


@pytest.fixture
def clock(monkeypatch) -> list[float]:
    now = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: now[0])
    return now


def profile(backend: FakeBackend, repeats: int = 3):
    return profile_backend(backend, max_active=3, prompt_tokens=32, decode_tokens=8,
                           repeats=repeats, step_tokens=64)  # fmt: skip


def test_one_stalled_sample_is_outvoted_by_the_median(clock) -> None:
    # The first batch-2 measurement sees one 1-second stall (e.g. a JIT compile).
    clean = profile(TimedBackend(clock, {}))
    result = profile(TimedBackend(clock, {2: [0.0] * 2 + [1.0]}))
    assert result.decode_median_tok_s == pytest.approx(clean.decode_median_tok_s, rel=1e-6)
    assert result.decode_median_tok_s[0] == pytest.approx(1 / 0.011, rel=1e-3)
    assert result.decode_tok_s == result.decode_median_tok_s and result.decode_repaired == []
    assert result.decode_spread[1] > 0.5 and result.decode_spread[0] == pytest.approx(0, abs=1e-9)
    assert result.repeats == 3


def test_a_point_stalled_in_every_run_is_repaired_and_the_repair_recorded(clock) -> None:
    # Batch 2 stalls 0.5 s in every one of its timed steps: its median is wrecked.
    result = profile(TimedBackend(clock, {2: [0.5] * 1000}))
    medians = result.decode_median_tok_s
    assert medians[1] < medians[0] / 10
    assert medians[0] < result.decode_tok_s[1] < medians[2]  # replaced from its neighbours
    (line,) = result.decode_repaired
    assert line.startswith("batch 2:") and "replaced by" in line
    assert result.to_json()["decode_repaired"] == [line]


def test_fewer_than_three_repeats_are_refused() -> None:
    with pytest.raises(ValueError, match="repeats"):
        profile(FakeBackend(), repeats=2)
