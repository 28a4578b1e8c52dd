"""A worker's rates held to what the router sees it serve.

Every rate a worker sends (its Ready's profile, its heartbeats' step model) is its
own word. The router checks that word against what it observes itself: the
tokens it relays and when. Over each stretch of time in which the worker holds
requests ("busy"), the work it delivered is valued at its own claimed prices:

- each decode token relayed costs ``1 / decode_tok_s(b)`` seconds, b the rows
  decoding there (requests that already produced a token), as a step of b rows
  takes ``b / decode_tok_s(b)`` seconds and yields b tokens;
- a request's first token costs its uncached prompt at ``prefill_tok_s``.

An honest, fully used worker delivers about one claimed second of work per busy
second. ``served / busy`` per window of at least WINDOW_S busy seconds (closed only
when work is credited, so a long prefill is one window, not several empty ones);
the median of the last WINDOWS windows is the worker's served ratio. Below
1 / BORNE_OUT its claims are not borne out, and it is priced at its claims times
that ratio (every rate), with the reason shown in ``tandem status`` and /metrics.
A worker that claims 100x its speed is thus priced near its real speed after
MIN_WINDOWS busy seconds, and cannot buy all the traffic; one that holds its tokens
back and sends them in a burst only delays its credit. Claims lower than what is
served are left alone (a worker that undersells itself only loses traffic).
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, replace

from tandem.common.pricing import Rates, bounded_rate

WINDOW_S = 1.0  # busy seconds per window (at least)
WINDOWS = 5  # the served ratio is the median of this many recent windows
MIN_WINDOWS = 3  # fewer: no judgement yet
BORNE_OUT = 3.0  # claims more than this many times what is served are repriced


@dataclass
class Served:
    """One worker's delivered work against its busy time (the module docstring)."""

    decoding: int = 0  # in-flight requests that have produced a token
    at: float | None = None  # the clock at the last event counted
    idle: bool = True  # it held no request at ``at``
    busy_s: float = 0.0  # this window's
    credit_s: float = 0.0  # this window's work, at its claimed prices
    ratios: deque[float] | None = None
    ratio: float | None = None  # median of ``ratios``; None until MIN_WINDOWS

    def elapse(self, now: float, busy_since: float | None) -> None:
        """Time passes up to ``now``; the worker was busy from ``busy_since`` (None:
        since the last event, unless it was idle then)."""
        start = busy_since if self.idle else self.at
        if start is not None and now > start:
            self.busy_s += now - start
        self.at = now

    def credit(self, seconds: float) -> bool:
        """``seconds`` of claimed work were delivered; True when the ratio changed."""
        self.credit_s += seconds
        if self.busy_s < WINDOW_S:
            return False
        if self.ratios is None:
            self.ratios = deque(maxlen=WINDOWS)
        self.ratios.append(self.credit_s / self.busy_s)
        self.busy_s = self.credit_s = 0.0
        before = self.ratio
        if len(self.ratios) >= MIN_WINDOWS:
            self.ratio = statistics.median(self.ratios)
        return self.ratio != before

    def settle(self, now: float, holding: bool) -> None:
        """After an event at ``now``: whether the worker holds requests from here."""
        self.at, self.idle = now, not holding

    @property
    def repriced(self) -> bool:
        return self.ratio is not None and self.ratio * BORNE_OUT < 1.0

    def priced(self, claimed: Rates) -> Rates:
        """``claimed`` as routing should use it: scaled to what is served when its
        claims are not borne out."""
        if not self.repriced or self.ratio is None:
            return claimed
        f = self.ratio
        return replace(
            claimed,
            prefill_tok_s=bounded_rate(claimed.prefill_tok_s * f),
            decode_tok_s=tuple(bounded_rate(x * f) for x in claimed.decode_tok_s),
            context_s=claimed.context_s / f,
            prefill_by_chunk=tuple((c, bounded_rate(r * f)) for c, r in claimed.prefill_by_chunk),
        )

    def describe(self) -> dict[str, object]:
        """The status row's ``served`` entry."""
        ratio = None if self.ratio is None else round(self.ratio, 4)
        out: dict[str, object] = {"ratio": ratio, "windows": len(self.ratios or ())}
        if self.repriced:
            out["repriced"] = (
                f"its served tokens show {ratio:.3g}x the work its rates claim (below "
                f"1/{BORNE_OUT:g}): priced at {ratio:.3g}x its claims"
            )
        return out
