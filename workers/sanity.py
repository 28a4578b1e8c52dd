"""Judging a start-up measurement before a worker advertises it.

A worker measures itself in a few seconds at start (``workers.profiler.warm_up``),
often while the machine is busy: the other processes of ``tandem serve`` start at
the same moment. A busy machine only ever makes a step *slower* (a stall, a
neighbour on the core), never faster, so when two measured batch sizes disagree
the slower one is the suspect. Physics bounds aggregate decode rates by batch
size: more rows never lower it (r_b >= r_b' for b' < b) and never shorten a step
(r_b >= r_b' * b / b' for b' > b). On this 2-core machine three busy starts
measured [0, 1, 3, 8], [2, 14, 18, 22] and [1, 77, 95, 117] tok/s at batch 1-4
while the worker then served 16-102 tok/s.

``judge`` takes the measured points (batch size -> aggregate tok/s):

1. a point that is not a positive number is discarded;
2. the point furthest below what another point implies is discarded while that is
   more than ``FAR`` (3x) below, at most ``max(1, DISCARD_SHARE)`` of the points;
3. a measurement that needs more discards than that contradicts itself: all of it
   is rejected (``points`` None) and the worker falls back to its stored profile
   or a guess, marked provisional, until live steps price it.

What is left is not forced onto the bounds: a real GPU's step at 16 rows was
shorter than at 8 (the H200's sim profile), and ``common.pricing`` fits the
table monotone anyway. Only a point far below them is a stall.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

FAR = 3.0  # a point this many times below what a neighbour implies is a stall
DISCARD_SHARE = 0.25  # more discards than max(1, this share): the whole measurement goes


@dataclass(frozen=True)
class Verdict:
    """What ``judge`` made of a measurement: the points to use (None: reject it all)
    and, in words, what it changed."""

    points: dict[int, float] | None
    notes: list[str] = field(default_factory=list)

    @property
    def rejected(self) -> bool:
        return self.points is None


def floor_from(b: int, other_b: int, other_rate: float) -> float:
    """The least aggregate tok/s at batch ``b`` that ``other_rate`` at ``other_b``
    allows: a step never gets shorter with more rows, rows never lower the total."""
    return other_rate * b / other_b if other_b > b else other_rate


def _slowness(b: int, points: Mapping[int, float]) -> float:
    """How many times point ``b`` lies below what the other points imply (1: not)."""
    rate = points[b]
    floors = [floor_from(b, ob, r) for ob, r in points.items() if ob != b]
    return max([1.0, *(f / rate for f in floors)])


def judge(measured: Mapping[int, object]) -> Verdict:
    """The measured points less their stalls, or rejected (see the module docstring).

    A value may be anything a measurement produced (None, NaN, a string): rule 1."""
    notes: list[str] = []
    points: dict[int, float] = {}
    for b, rate in sorted(measured.items()):
        if isinstance(rate, int | float) and math.isfinite(rate) and rate > 0:
            points[b] = float(rate)
        else:
            notes.append(f"batch {b}: {rate} tok/s is no rate; discarded")
    budget = max(1, int(DISCARD_SHARE * len(measured)))
    while len(points) >= 2:
        worst = max(points, key=lambda b: _slowness(b, points))
        factor = _slowness(worst, points)
        if factor <= FAR:
            break
        notes.append(
            f"batch {worst}: {points.pop(worst):.0f} tok/s is {factor:.1f}x below what the "
            "other batch sizes allow (measured in a stall?); discarded"
        )
    if len(notes) > budget or not points:
        return Verdict(None, [*notes, "the measurement contradicts itself: not used"])
    return Verdict(points, notes)
