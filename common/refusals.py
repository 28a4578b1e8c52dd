"""Refused frames, counted by reason and logged at a bounded rate.

Whatever a peer sends is refused in the same few ways (``protocol.Refusal``); a
flood of bad frames must not fill the disk with one log line each, nor hide the
first of them. ``RefusalLog`` logs the first ``burst`` refusals of each window of
``window_s`` seconds, then one line per window saying how many it left out.
"""

from __future__ import annotations

import logging
import time
from collections import Counter


class RefusalLog:
    def __init__(
        self, log: logging.Logger, level: int = logging.WARNING, burst: int = 10,
        window_s: float = 10.0,
    ) -> None:  # fmt: skip
        self.log, self.level, self.burst, self.window_s = log, level, burst, window_s
        self.counts: Counter[str] = Counter()  # every refusal since start, by reason
        self._window_at = -window_s
        self._logged = self._left_out = 0

    def refused(self, reason: str, fmt: str, *args: object) -> None:
        """Count a refusal of ``reason``; log ``fmt % args`` unless the window's burst is spent."""
        self.counts[reason] += 1
        self.note(fmt, *args)

    def note(self, fmt: str, *args: object, exc_info: bool = False) -> None:
        """Log ``fmt % args`` within the rate (also for failures that are not refusals:
        a bug a peer's frame trips, with its traceback when ``exc_info``)."""
        now = time.monotonic()
        if now - self._window_at >= self.window_s:
            if self._left_out:
                self.log.log(self.level, "... and %d more like these in the last %.0f s "
                             "(not logged)", self._left_out, now - self._window_at)  # fmt: skip
            self._window_at, self._logged, self._left_out = now, 0, 0
        if self._logged < self.burst:
            self._logged += 1
            self.log.log(self.level, fmt, *args, exc_info=exc_info)
        else:
            self._left_out += 1
