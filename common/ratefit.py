"""The monotone fit of a worker's aggregate decode rates by batch size.

A worker running b requests can always do at least what it does with b - 1 of
them (it could leave one row idle), and a step never gets shorter with more
rows, so aggregate decode tok/s is non-decreasing in b and grows at most b'/b
from b to b'. A measured table that breaks this is noise: a JIT step, a stall,
a neighbour process. ``fit_decode_rates`` drops points far off what their
neighbours allow (most extreme first), then fits the rest with weighted
pool-adjacent-violators, so one slow sample can never make batch 2 look 16x
slower than batch 1. Used on live step statistics (``common.steptime``), on
stored profiles (``tandem profile``, worker start) and on the router's blend.

One exception: a measured step down. llama.cpp's CUDA decode changes kernels past 8
rows (the H200: 4.07 ms at 8 rows, 6.08 ms at 9, so 9 rows decode slower in
aggregate than 8), and the worker runs every row it admits, so "it could leave one
idle" is not what it does. ``measured_drops`` names such a step where both sizes
were measured with enough steps and the next measured size confirms it (a stall
is one low point; a kernel change keeps the level down); the fit then runs on each
side of it apart (``steps``), keeping the drop. A table alone (a stored profile)
cannot tell a step from noise, so its fit keeps only the steps it is told of.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

OUTLIER_FACTOR = 3.0  # "far off": more than 3x outside what the neighbours allow
MAX_DROPPED_SHARE = 0.25  # the fit never drops more than this share of the points
# A measured step down: the aggregate rate at b below b - 1's by more than this share
# (beyond the +-15 % a price must hold to) ...
STEP_DROP = 0.15
STEP_SAMPLES = 4  # ... with at least this many steps timed at each side


@dataclass(frozen=True)
class Fit:
    """A fitted aggregate decode rate table and what the fit changed."""

    rates: tuple[float, ...]  # non-decreasing tok/s at batch 1, 2, ...
    dropped: tuple[int, ...] = ()  # batch sizes whose point was far off its neighbours
    pooled: tuple[int, ...] = ()  # batch sizes the monotone fit moved by more than 1 %
    steps: tuple[int, ...] = ()  # batch sizes a kept step down starts at (rates drop there)


def fit_decode_rates(
    rates: Sequence[float], weights: Sequence[float] | None = None, steps: Iterable[int] = ()
) -> Fit:
    """Aggregate decode rates by batch size, non-decreasing but for the ``steps`` told
    (batch sizes where a measured step down starts), robust to one bad point.

    First the point furthest off what its neighbours allow (``suspicious_points``)
    is dropped while it is more than OUTLIER_FACTOR off, at most MAX_DROPPED_SHARE of the points (at
    least one, from 3 points on); dropped
    points take their value from the fit of the rest. Then a weighted
    pool-adjacent-violators fit (weights: evidence behind each point), on each side of
    a told step apart where the rates still drop there (``split_fit``).
    """
    values = [float(x) for x in rates]
    if not values or any(not (math.isfinite(x) and x > 0) for x in values):
        raise ValueError("rates must be a non-empty list of positive numbers")
    w = [1.0] * len(values) if weights is None else [max(1e-9, float(x)) for x in weights]
    if len(w) != len(values):
        raise ValueError("weights must match rates")
    dropped = suspicious_points(values)
    keep = [i for i in range(len(values)) if i + 1 not in dropped]
    starts = [b for b in sorted(set(steps)) if b - 1 in keep and b - 2 in keep]
    kept_values = [values[i] for i in keep]
    cuts = [keep.index(b - 1) for b in starts]
    fitted_kept, kept_starts = split_fit(kept_values, [w[i] for i in keep], cuts)
    fitted = _fill(len(values), keep, fitted_kept)
    pooled = tuple(
        i + 1
        for i, (a, b) in enumerate(zip(values, fitted, strict=True))
        if i + 1 not in dropped and abs(a - b) > 0.01 * a
    )
    return Fit(tuple(fitted), dropped, pooled, tuple(keep[c] + 1 for c in kept_starts))


def split_fit(
    values: Sequence[float], weights: Sequence[float], cuts: Iterable[int]
) -> tuple[list[float], list[int]]:
    """``pav`` on each run of ``values`` between ``cuts`` (indices where a step down
    starts), and the cuts kept: one whose values no longer drop is fitted across."""
    kept = [c for c in sorted(set(cuts)) if 0 < c < len(values) and values[c] < values[c - 1]]
    out: list[float] = []
    for lo, hi in zip([0, *kept], [*kept, len(values)], strict=True):
        out += pav(values[lo:hi], weights[lo:hi])
    return out, kept


def measured_drops(points: Mapping[int, tuple[float, int]]) -> tuple[int, ...]:
    """Batch sizes b where measured rates (b -> (tok/s, steps timed)) step down: b - 1
    and b both measured with STEP_SAMPLES steps or more, b more than STEP_DROP below
    b - 1, and the next measured size above b still below b - 1 (a stall at b alone is
    not a step: the level comes back after it)."""
    sizes = sorted(points)
    out = []
    for i in range(1, len(sizes) - 1):
        a, b, nxt = sizes[i - 1], sizes[i], sizes[i + 1]
        (ra, na), (rb, nb) = points[a], points[b]
        if b != a + 1 or min(na, nb) < STEP_SAMPLES:
            continue
        if rb < (1 - STEP_DROP) * ra and points[nxt][0] < ra:
            out.append(b)
    return tuple(out)


def suspicious_points(rates: Sequence[float]) -> tuple[int, ...]:
    """Batch sizes (1-based) of points more than OUTLIER_FACTOR off their neighbours.

    Each neighbour b' bounds the aggregate rate at b physically: more rows never
    lower it (r_b >= r_b' for b' < b) and never shorten a step (r_b <= r_b' * b / b').
    A point's score is the median, over its nearest 4 neighbours, of how many times
    outside that interval it lies; the worst point over OUTLIER_FACTOR is dropped,
    then scores are taken again without it.
    """
    alive = list(range(len(rates)))
    dropped: list[int] = []
    budget = max(1, int(MAX_DROPPED_SHARE * len(rates)))  # 3 points can still name one
    while len(dropped) < budget and len(alive) >= 3:
        worst, worst_score = -1, OUTLIER_FACTOR
        for pos, i in enumerate(alive):
            around = alive[max(0, pos - 4) : pos] + alive[pos + 1 : pos + 5]
            near = sorted(around, key=lambda j: (abs(j - i), j))[:4]
            score = statistics.median(_off_by(rates, i, j) for j in near)
            if score > worst_score:
                worst, worst_score = i, score
        if worst < 0:
            break
        alive.remove(worst)
        dropped.append(worst + 1)
    return tuple(sorted(dropped))


def _off_by(rates: Sequence[float], i: int, j: int) -> float:
    """How many times rates[i] lies outside what rates[j] allows (1.0: inside)."""
    bi, bj = i + 1, j + 1
    lo, hi = (rates[j], rates[j] * bi / bj) if bj < bi else (rates[j] * bi / bj, rates[j])
    return max(1.0, lo / rates[i], rates[i] / hi)


def pav(values: Sequence[float], weights: Sequence[float]) -> list[float]:
    """Weighted least-squares non-decreasing fit of ``values`` (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, weight, count]
    for v, w in zip(values, weights, strict=True):
        blocks.append([v, w, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, w2, n2 = blocks.pop()
            m1, w1, n1 = blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, n1 + n2])
    return [m for m, _, n in blocks for _ in range(int(n))]


def _fill(n: int, keep: list[int], fitted: list[float]) -> list[float]:
    """Values at every index: fitted ones where kept, else linear between kept
    neighbours (the nearest one past either end)."""
    out = [0.0] * n
    for i, v in zip(keep, fitted, strict=True):
        out[i] = v
    for i in range(n):
        if i in keep:
            continue
        left = max((k for k in keep if k < i), default=None)
        right = min((k for k in keep if k > i), default=None)
        if left is not None and right is not None:
            t = (i - left) / (right - left)
            out[i] = out[left] + t * (out[right] - out[left])
        else:  # past either end: the nearest kept value
            out[i] = out[next(k for k in (left, right) if k is not None)]
    return out


def explain(rates: Sequence[float], fit: Fit, min_change: float = 0.10) -> list[str]:
    """One line per repair ``fit`` made to ``rates`` that a person should know about:
    every dropped point, and every run of batch sizes the monotone fit moved by more
    than ``min_change`` (smaller moves are measurement noise)."""
    lines = [
        f"batch {b}: {rates[b - 1]:.0f} tok/s is more than {OUTLIER_FACTOR:g}x off what its "
        f"neighbours allow (a stall or a JIT step?); replaced by {fit.rates[b - 1]:.0f}"
        for b in fit.dropped
    ]
    moved = [
        b for b in fit.pooled if abs(fit.rates[b - 1] - rates[b - 1]) > min_change * rates[b - 1]
    ]
    for run in _runs(moved):
        was = _span(rates[b - 1] for b in run)
        now = _span(fit.rates[b - 1] for b in run)
        where = f"batch {run[0]}" if len(run) == 1 else f"batches {run[0]}-{run[-1]}"
        lines.append(f"{where}: {was} tok/s breaks the rise with batch size; fitted to {now}")
    return lines


def _runs(batches: list[int]) -> list[list[int]]:
    """Consecutive runs: [2, 3, 5] -> [[2, 3], [5]]."""
    runs: list[list[int]] = []
    for b in batches:
        if runs and runs[-1][-1] == b - 1:
            runs[-1].append(b)
        else:
            runs.append([b])
    return runs


def _span(values: Iterable[float]) -> str:
    seen = list(values)
    lo, hi = min(seen), max(seen)
    return f"{lo:.0f}" if round(lo) == round(hi) else f"{lo:.0f}-{hi:.0f}"
