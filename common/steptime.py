"""Step-time models: what one engine step costs on a worker, measured while it serves.

Pure Python, no model, shared by the worker (which records every step) and the
router (which prices with the result):

- ``StepStats`` (worker side) keeps, per decode batch size, a bounded window of
  step seconds and the context the batch decoded at; per prefill chunk size
  (power-of-two buckets) a window of prefill tok/s. Estimates are clipped means
  (``center``: each sample counted at most ``CLIP`` times the window's median, the
  median below ``TRIM_MIN`` samples); a window whose last 16 samples run 25 % off
  its older ones keeps only its newest (the device changed speed: ``_Window``). So a
  JIT step or a stall in a window barely moves them, while a right skew that
  recurs — a GPU whose slowest steps take 2-3x its median — is priced as a run
  of steps pays it: a burst lasts the *sum* of its steps, and a median prices that
  sum short under a right skew (priced on medians, the twin replayed the H200's
  bursts 14-18 % faster than the box served them: docs/results/h200/matrix-warm5/,
  matrix-warm6/).
- ``StepModel`` is the compact wire form (a few short lists) with strict
  validation: finite, positive, bounded lengths. Both sides build it only
  through ``__post_init__``, so a bad heartbeat cannot reach routing.
- ``common.ratefit`` turns rates by batch size into a non-decreasing table
  (used on these estimates, on profiles, and on their blend in the router).

Decode slows with context (attention reads every cached token), so a step is
modelled as ``step_s(b, x) = s_b + k * b * (x - ctx)``: ``s_b`` the step seconds
at batch b with ``ctx`` tokens of context per row, ``k`` the extra seconds per
context token per row (a robust slope over samples of equal batch size).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tandem.common import validation as bounds
from tandem.common.protocol import StepReport

# The wire's bounds (common/validation.py): a model within them is one a heartbeat carries.
MAX_BATCH = bounds.MAX_ACTIVE  # largest batch size a model may describe
MAX_POINTS = bounds.STEP_POINTS  # entries per wire list: one per batch size or chunk bucket
MAX_STEP_S = bounds.MAX_STEP_S
MIN_STEP_S = bounds.MIN_STEP_S
MAX_TOK_S = bounds.MAX_RATE_TOK_S
MAX_CONTEXT = bounds.MAX_CONTEXT
WINDOW = 64  # samples kept per batch size / chunk bucket
COUNT_CAP = bounds.COUNT_CAP  # sample counters stop here (they only weigh evidence)
MIN_CONTEXT_SPAN = 32  # context tokens per row two samples must differ by to give a slope
MIN_SLOPE_PAIRS = 8  # fewer such pairs: no slope (one pair once zeroed a batch-16 step)
MIN_AFTER_CONTEXT = 0.25  # moving a sample to another context leaves at least this share of it
MIN_PREFILL_SHARE = 0.25  # a mixed step counts for prefill when prefill took >= this share
CLIP = 4.0  # a sample counts for at most this many times its window's median
SHIFT = 0.25  # recent samples' median this far off the older ones': the device changed speed
SHIFT_RECENT = 16  # samples a shift is judged on
SHIFT_EVERY = 8  # samples between shift checks (each reads the window); kept after a shift
TRIM_MIN = 10  # fewer samples than this: the median (a mean of few says little)


def batch_ladder(n: int) -> list[int]:
    """Powers of two below ``n``, and ``n``: the batch sizes a worker's warm-up
    measures and /metrics shows (9 at max active 256, not 256)."""
    sizes = {n} if n > 0 else set()
    b = 1
    while b < n:
        sizes.add(b)
        b *= 2
    return sorted(sizes)


@dataclass(frozen=True)
class StepModel:
    """A worker's measured step costs (wire form: ``to_wire`` / ``from_wire``).

    decode_batch: batch sizes with samples (strictly increasing, 1..MAX_BATCH).
    decode_step_s: seconds of one decode step at each (``center``), at ``context`` tokens
        of context per row. decode_samples: steps seen at each (evidence weight).
    context: tokens of context per decoding row the step seconds are quoted at.
    context_s: extra seconds per step per context token per row (>= 0).
    prefill_chunk: chunk buckets (upper bound of prompt tokens computed in a step,
        strictly increasing); prefill_tok_s: rate in each (``center`` of seconds per
        token, inverted: what a run of chunks takes); prefill_samples.
    """

    decode_batch: tuple[int, ...] = ()
    decode_step_s: tuple[float, ...] = ()
    decode_samples: tuple[int, ...] = ()
    context: float = 0.0
    context_s: float = 0.0
    prefill_chunk: tuple[int, ...] = ()
    prefill_tok_s: tuple[float, ...] = ()
    prefill_samples: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        _check_series("decode", self.decode_batch, self.decode_step_s, self.decode_samples,
                      MAX_BATCH, (MIN_STEP_S, MAX_STEP_S))  # fmt: skip
        _check_series("prefill", self.prefill_chunk, self.prefill_tok_s, self.prefill_samples,
                      1 << 30, (bounds.MIN_RATE_TOK_S, MAX_TOK_S))  # fmt: skip
        if not _finite_in(self.context, 0.0, MAX_CONTEXT):
            raise ValueError(f"context must be in [0, {MAX_CONTEXT}] tokens")
        if not _finite_in(self.context_s, 0.0, 1.0):
            raise ValueError("context_s must be in [0, 1] seconds per token")

    def to_wire(self) -> StepReport:
        return StepReport(
            list(self.decode_batch), list(self.decode_step_s), list(self.decode_samples),
            self.context, self.context_s,
            list(self.prefill_chunk), list(self.prefill_tok_s), list(self.prefill_samples),
        )  # fmt: skip

    @classmethod
    def from_wire(cls, report: StepReport) -> StepModel:
        """A heartbeat's ``steps`` (typed and bounded by the decoder); ValueError
        names a rule across its lists it breaks."""
        r = report
        return cls(
            tuple(r.decode_batch), tuple(r.decode_step_s), tuple(r.decode_samples),
            r.context, r.context_s,
            tuple(r.prefill_chunk), tuple(r.prefill_tok_s), tuple(r.prefill_samples),
        )  # fmt: skip

    @property
    def empty(self) -> bool:
        return not self.decode_batch and not self.prefill_chunk

    def decode_step_at(self, batch: int) -> float | None:
        """Seconds of one decode step at ``batch`` rows (at ``context``): the batch's own
        estimate, else the next larger one measured (a step is no faster with more
        rows), else the largest measured; None while nothing is."""
        if not self.decode_batch:
            return None
        for b, s in zip(self.decode_batch, self.decode_step_s, strict=True):
            if b >= batch:
                return s
        return self.decode_step_s[-1]

    def prefill_rate_at(self, tokens: int) -> float | None:
        """Prefill tok/s of a chunk of ``tokens``: the rate of the largest measured
        bucket up to its own (a longer chunk runs no slower a token, so a smaller
        bucket's rate is conservative), else the smallest bucket's; None while nothing
        is measured."""
        if not self.prefill_chunk:
            return None
        bucket = 1 << max(0, tokens - 1).bit_length()
        rate = self.prefill_tok_s[0]
        for c, r in zip(self.prefill_chunk, self.prefill_tok_s, strict=True):
            if c > bucket:
                break
            rate = r
        return rate

    def prefill_budget(self, batch: int, factor: float, cap: int, floor: int) -> int:
        """Prompt tokens a step decoding ``batch`` rows may add so that it lasts about
        ``factor`` decode steps: what a decoding stream waits at most for a chunk.
        ``cap`` while the model cannot say, so that the first chunk's rate gets
        measured (a smaller one beside decode rows may be too small a share of its
        step for ``StepStats.record`` to split it, and then nothing would ever be
        measured); at least ``floor``, at most ``cap``.

        A chunk is priced at its bucket's measured rate, which in a mixed step is the
        prefill's marginal cost beside the decode rows (``StepStats.record``); the
        largest chunk among each rate's fill of the time left that fits at its own
        rate wins."""
        decode_s = self.decode_step_at(batch)
        if decode_s is None or not self.prefill_chunk or factor <= 0:
            return cap
        extra_s = (factor - 1.0) * decode_s
        best = 0
        for n in (cap, *(min(cap, int(extra_s * r)) for r in self.prefill_tok_s)):
            rate = self.prefill_rate_at(n)
            if rate is not None and n > best and n <= extra_s * rate * (1 + 1e-9):
                best = n
        return min(cap, max(floor, best))

    def decode_tok_s(self) -> dict[int, tuple[float, int]]:
        """Aggregate decode tok/s and sample count by batch size (at ``context``)."""
        rows = zip(self.decode_batch, self.decode_step_s, self.decode_samples, strict=True)
        return {b: (b / s, n) for b, s, n in rows}


def _check_series(
    what: str, keys: Sequence[object], values: Sequence[float], counts: Sequence[object],
    key_max: int, value_range: tuple[float, float],
) -> None:  # fmt: skip
    # objects: a dataclass does not enforce its fields' types, so a caller's strings land here
    if not len(keys) == len(values) == len(counts) or len(keys) > MAX_POINTS:
        raise ValueError(f"{what}: lists must have equal lengths <= {MAX_POINTS}")
    sizes = [k for k in keys if isinstance(k, int) and 1 <= k <= key_max]
    if len(sizes) < len(keys):
        raise ValueError(f"{what}: sizes must be integers in 1..{key_max}")
    if any(b <= a for a, b in zip(sizes, sizes[1:], strict=False)):
        raise ValueError(f"{what}: sizes must be strictly increasing")
    lo, hi = value_range
    if any(not _finite_in(v, lo, hi) for v in values):
        raise ValueError(f"{what}: values must be finite and in [{lo:g}, {hi:g}]")
    if any(not isinstance(n, int) or not 1 <= n <= COUNT_CAP for n in counts):
        raise ValueError(f"{what}: sample counts must be integers in 1..{COUNT_CAP}")


def _finite_in(x: Any, lo: float, hi: float) -> bool:
    return (
        isinstance(x, int | float)
        and not isinstance(x, bool)
        and math.isfinite(x)
        and lo <= x <= hi
    )


# ---------------------------------------------------------------- worker-side statistics
@dataclass
class _Window:
    samples: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=WINDOW))
    seen: int = 0  # samples ever added (capped)

    def add(self, value: float, context: float = 0.0) -> None:
        self.samples.append((value, context))
        self.seen = min(COUNT_CAP, self.seen + 1)
        if self.seen % SHIFT_EVERY == 0 and len(self.samples) >= 2 * SHIFT_RECENT:
            self._follow_a_shift()

    def center(self) -> float:
        """The window's estimate as recorded (``center`` of its values)."""
        return center([v for v, _ in self.samples])

    def _follow_a_shift(self) -> None:
        """When the last ``SHIFT_RECENT`` samples' median is ``SHIFT`` or more off the
        older samples' median, the device changed speed: keep only the samples since
        the last check (the median of 16 moves once about half are new, so those
        are). A window mixing two speeds would move to the new one a sample at a
        time (half a window to be halfway there); a median of 16 is moved by no
        stall shorter than 8 steps, and a tail that recurs sits on both sides alike.
        Not when the rows' context moved by as much (long prompts after short ones):
        the context slope prices that, and needs the window's spread of contexts."""
        values = [v for v, _ in self.samples]
        cut = len(values) - SHIFT_RECENT
        ratio = statistics.median(values[cut:]) / statistics.median(values[:cut])
        if 1 / (1 + SHIFT) < ratio < 1 + SHIFT:
            return
        contexts = [x for _, x in self.samples]
        then, now = statistics.median(contexts[:cut]), statistics.median(contexts[cut:])
        if max(then, now) > (1 + SHIFT) * max(1.0, min(then, now)):
            return  # the rows' context moved as much: the slope's to explain, not a new speed
        for _ in range(len(values) - SHIFT_EVERY):
            self.samples.popleft()


class StepStats:
    """Robust statistics of one worker's engine steps (see the module docstring).

    ``record`` takes every step the engine ran: how many rows decoded, their total
    context (KV tokens before the step), prompt tokens computed, and seconds.
    ``version`` counts recorded samples, so callers can tell when to re-send;
    ``sizes`` counts batch sizes and chunk buckets opened (the first sample at a
    new batch size is worth sending at once: the router has nothing there).
    """

    def __init__(self) -> None:
        self.decode: dict[int, _Window] = {}  # batch size -> (step seconds, context per row)
        self.prefill: dict[int, _Window] = {}  # chunk bucket -> (tok/s, 0)
        self.version = 0
        self.sizes = 0  # batch sizes and chunk buckets ever opened: new ones are news
        # The last slope the windows gave. How decode slows with context is the device's
        # (attention reads every cached token), so windows that span too little context
        # to measure it (a run of long prompts after short ones) keep it, not 0: a slope
        # of 0 would price the next short prompt at the long ones' steps.
        self.slope = 0.0

    def record(self, batch: int, context_tokens: int, prefill_tokens: int, seconds: float) -> None:
        if not (math.isfinite(seconds) and 0 < seconds <= MAX_STEP_S) or batch < 0:
            return  # a clock glitch says nothing about the device
        if batch > MAX_BATCH or prefill_tokens < 0:
            return
        if prefill_tokens == 0 and batch > 0:
            self._window(self.decode, batch).add(seconds, context_tokens / batch)
        elif prefill_tokens > 0:
            decode_s = self._decode_estimate(batch) if batch else 0.0
            if decode_s is None:
                return  # a mixed step we cannot split yet
            prefill_s = seconds - decode_s
            if prefill_s < MIN_PREFILL_SHARE * seconds:
                return  # mostly decode: the remainder is noise, not prefill
            bucket = 1 << (prefill_tokens - 1).bit_length()  # 1, 2, 4, ... >= tokens
            self._window(self.prefill, bucket).add(prefill_tokens / prefill_s)
        else:
            return
        self.version += 1

    def _window(self, table: dict[int, _Window], key: int) -> _Window:
        if key not in table:
            self.sizes += 1
            if len(table) >= MAX_POINTS:  # bounded: forget the rarest
                del table[min(table, key=lambda k: table[k].seen)]
        return table.setdefault(key, _Window())

    def _decode_estimate(self, batch: int) -> float | None:
        w = self.decode.get(batch)
        if w is None or len(w.samples) < 3:
            return None
        return w.center()

    def decode_estimates(self, min_samples: int = TRIM_MIN) -> dict[int, float]:
        """Each batch size's step seconds as recorded (no context adjustment), where
        its window holds ``min_samples`` or more."""
        return {b: w.center() for b, w in self.decode.items() if len(w.samples) >= min_samples}

    def model(self) -> StepModel:
        """The current estimates in wire form (empty lists while nothing is known)."""
        measured = context_slope(self.decode)
        k = self.slope = self.slope if measured is None else measured
        rows = [x for w in self.decode.values() for _, x in w.samples]
        ctx = statistics.median(rows) if rows else 0.0
        batches = sorted(self.decode)
        steps = []
        for b in batches:
            at_ctx = [
                max(MIN_AFTER_CONTEXT * s, s + k * b * (ctx - x)) for s, x in self.decode[b].samples
            ]
            steps.append(max(MIN_STEP_S, center(at_ctx)))
        chunks = sorted(self.prefill)
        return StepModel(
            decode_batch=tuple(batches),
            decode_step_s=tuple(min(MAX_STEP_S, s) for s in steps),
            decode_samples=tuple(self.decode[b].seen for b in batches),
            context=min(float(MAX_CONTEXT), ctx),
            context_s=min(1.0, k),
            prefill_chunk=tuple(chunks),
            prefill_tok_s=tuple(_rate_of(self.prefill[c]) for c in chunks),
            prefill_samples=tuple(self.prefill[c].seen for c in chunks),
        )


def _rate_of(window: _Window) -> float:
    """A prefill window's rate (``center`` of seconds per token, inverted), within the
    wire's bounds."""
    rate = 1.0 / center([1.0 / r for r, _ in window.samples])
    return min(MAX_TOK_S, max(bounds.MIN_RATE_TOK_S, rate))


def center(values: Sequence[float]) -> float:
    """What one sample costs in a run of them, robustly: the mean of ``values`` with
    each clipped at ``CLIP`` times their median; the median while there are fewer
    than ``TRIM_MIN``. A tail that recurs (the H200 GPU's slowest tenth of decode
    steps averaged 1.4-2.7x its median step) is priced in full, while one stall,
    however long, moves a window of n samples by at most (CLIP - 1) / n of the
    median.
    A trimmed mean would not do: cutting a tenth off each end cut the GPU's whole
    tail (trimmed mean / median 0.98-1.04 where mean / median ran 1.01-1.19)."""
    n = len(values)
    mid = statistics.median(values)
    if n < TRIM_MIN:
        return mid
    cap = CLIP * mid
    return statistics.fmean(min(x, cap) for x in values)


def context_slope(decode: dict[int, _Window]) -> float | None:
    """Extra step seconds per context token per row, >= 0; None where the windows
    cannot say (too few pairs).

    Within each batch size, samples sorted by context are paired with the sample
    half a window further on (when their contexts differ by MIN_CONTEXT_SPAN or
    more); the slope is the median over all pairs of all batch sizes, each pair's
    seconds difference divided by its extra context tokens summed over the rows.
    Medians of pairwise slopes (Theil–Sen) ignore a minority of stalled steps; with
    fewer than ``MIN_SLOPE_PAIRS`` pairs there is none. One pair is one accident:
    in the twin, a GPU whose every 5th step ran 2x measured at start a slope from a
    single pair of batch-4 steps that, quoted at batch 16, priced its step at ~0 s.
    """
    slopes = []
    for b, w in decode.items():
        pts = sorted(w.samples, key=lambda sx: sx[1])
        half = len(pts) // 2
        for (s0, x0), (s1, x1) in zip(pts, pts[half:], strict=False):
            if x1 - x0 >= MIN_CONTEXT_SPAN:
                slopes.append((s1 - s0) / (b * (x1 - x0)))
    return max(0.0, statistics.median(slopes)) if len(slopes) >= MIN_SLOPE_PAIRS else None
