"""When client requests arrived: the recent past a policy may read the near future from.

The router notes each client request as it arrives (not the ones pinned to a
worker or only seeding a prefix, nor a migrated request's second routing) and
hands the policy, with the request, how long before it each earlier arrival of
the last ``WINDOW_S`` came (``RouteRequest.arrivals_before``). A policy that
expects more requests to follow a burst (``lookahead``) reads it; the others
ignore it. Bounded: at most ``KEEP`` arrivals are kept.
"""

from __future__ import annotations

from collections import deque
from itertools import repeat
from operator import sub


class ArrivalLog:
    WINDOW_S = 10.0
    KEEP = 64

    def __init__(self) -> None:
        self._times: deque[float] = deque(maxlen=self.KEEP)

    def note(self, now: float) -> tuple[float, ...]:
        """Record an arrival at ``now``; returns how long before it each earlier
        arrival of the window came, newest first."""
        return ages(now, self.record(now))

    def record(self, now: float) -> tuple[float, ...]:
        """Record an arrival at ``now``; returns the clock times of the window's earlier
        arrivals, newest first (``ages`` makes them ``note``'s answer, when read: a
        router with one candidate never reads them)."""
        while self._times and now - self._times[0] > self.WINDOW_S:
            self._times.popleft()
        earlier = tuple(reversed(self._times))
        self._times.append(now)
        return earlier


def ages(now: float, times: tuple[float, ...]) -> tuple[float, ...]:
    """How long before ``now`` each of ``times`` was."""
    return tuple(map(sub, repeat(now), times))  # in C
