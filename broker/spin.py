"""Whether the router polls for a moment, without sleeping, before it waits for input.

On a virtual machine a thread that sleeps can wake late: when its virtual CPU has
nothing to run it halts, and a halted vCPU runs again only when the host schedules
it. On the 2-core VM the router is measured on (no cpuidle driver: every idle is a
halt) that cost 1-2 ms per wake-up in some periods: a lone request took 0.78-3.3 ms
through a router that slept at once against 0.67-1.03 through one that polls up to
2 ms first, and 0.62-0.94 through one that never sleeps; a 0.5 or 1 ms window was
not enough once in four or five rounds, since the peers wake late as well
(docs/results/router-overhead.md, twelfth session). Polling before sleeping holds a
core while it polls, so it is done only while it pays:

- after a wait that ended within ``PROBE_WITHIN_S`` the next wait polls for up to
  ``max_s`` first (a probe); the time a wait takes includes the late wake-up, so
  its length alone cannot tell input that came soon from input that came late;
- polling stays on while it catches input (input keeps arriving within ``max_s``
  of each turn: the router is then nearly busy anyway);
- a poll that catches nothing turns it off, and the next probe waits for 1, 2, 4,
  ... up to ``MAX_BACKOFF`` waits: input that keeps coming a few milliseconds
  after each turn costs one failed probe (``max_s``) in 64 waits, ~1 % of a core
  at 3 ms. Only traffic earns a probe (a client's frame, or any frame while
  requests are out: broker/router.py), so an idle router's heartbeats never do, and
  a worker's decode steps tens of milliseconds apart do not either. A closed loop
  of lone requests keeps it on: the router then holds most of a core.
"""

from __future__ import annotations

PROBE_WITHIN_S = 0.005  # a wait this short (late wake-up included) earns a probe
MAX_BACKOFF = 64  # waits between failed probes, at most


class AdaptiveSpin:
    def __init__(self, max_s: float) -> None:
        if not 0 <= max_s <= 0.01:
            raise ValueError("the spin window must be in 0..10 ms")
        self.max_s = max_s
        self.window_s = 0.0  # how long the next wait polls first (0: it sleeps at once)
        self._skip = 0  # waits to let pass before the next probe
        self._backoff = 1

    def waited(self, seconds: float, caught: bool) -> None:
        """A wait for input ended after ``seconds`` (polling and sleeping together;
        ``math.inf``: it timed out, or what came is not worth polling for);
        ``caught``: input worth polling for came while it polled."""
        if caught:
            self._backoff = 1
            return
        if self.window_s:  # it polled and caught nothing: off, and probe later
            self.window_s = 0.0
            self._skip, self._backoff = self._backoff, min(MAX_BACKOFF, 2 * self._backoff)
        elif self._skip:
            self._skip -= 1
        elif seconds <= PROBE_WITHIN_S:
            self.window_s = self.max_s
