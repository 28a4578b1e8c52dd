"""Policies that need no model of the devices: round_robin, least_loaded, forced:<selector>."""

from __future__ import annotations

import itertools

from tandem.broker.policies.views import Decision, NoCandidate, RouteRequest, WorkerView, tie_break


class RoundRobin:
    name = "round_robin"
    takes_any = True

    def __init__(self) -> None:
        self._turn = itertools.count()

    def choose(self, req: RouteRequest, workers: list[WorkerView]) -> Decision:
        ordered = sorted(workers, key=lambda w: w.id)
        pick = ordered[next(self._turn) % len(ordered)]
        return Decision(pick.id, {w.id: float(w.id != pick.id) for w in ordered})


class LeastLoaded:
    """Fewest active + queued requests."""

    name = "least_loaded"
    takes_any = True

    def choose(self, req: RouteRequest, workers: list[WorkerView]) -> Decision:
        return tie_break(workers, {w.id: float(w.n_requests) for w in workers})


class Forced:
    """Only workers whose id or device label equals the selector."""

    takes_any = False  # a lone candidate of another name is refused, not chosen

    def __init__(self, selector: str) -> None:
        if not selector:
            raise ValueError("forced:<selector> needs a worker id or device label")
        self.selector = selector
        self.name = f"forced:{selector}"

    def matches(self, w: WorkerView) -> bool:
        return self.selector in (w.id, w.device)

    def choose(self, req: RouteRequest, workers: list[WorkerView]) -> Decision:
        fit = [w for w in workers if self.matches(w)]
        if not fit:
            raise NoCandidate(f"no connected worker matches {self.selector!r}")
        return LeastLoaded().choose(req, fit)
