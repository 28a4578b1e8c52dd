"""Routing policies: given one request and a view of every candidate worker, pick one.

A policy sees only plain data (``WorkerView``), built by the router from
heartbeats plus its own ledger, or read from a STATE.json by ``tandem route
explain``: both paths call the same ``choose``. Every policy returns a score per
candidate (lower is better) so decisions can be logged and explained.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class Load:
    """One request already on a worker: work it still needs (after cache discounts)."""

    prefill_remaining: int
    decode_remaining: int


@dataclass(frozen=True)
class WorkerView:
    id: str
    prefill_rate: float  # tok/s, cold prefill
    decode_rates: tuple[float, ...]  # aggregate decode tok/s at batch size 1, 2, ...
    max_active: int = 4
    device: str = ""
    cached_tokens: int = 0  # tokens of the incoming prompt this worker already holds
    active: tuple[Load, ...] = ()
    queued: tuple[Load, ...] = ()

    @property
    def n_requests(self) -> int:
        return len(self.active) + len(self.queued)

    def decode_rate(self, batch: int) -> float:
        """Aggregate decode tok/s when ``batch`` requests decode together."""
        b = max(1, min(batch, self.max_active, len(self.decode_rates)))
        return self.decode_rates[b - 1]


@dataclass(frozen=True)
class RouteRequest:
    prompt_tokens: int
    max_tokens: int


@dataclass(frozen=True)
class Decision:
    worker_id: str
    scores: dict[str, float] = field(default_factory=dict)


class Policy(Protocol):
    name: str

    def choose(self, req: RouteRequest, workers: list[WorkerView]) -> Decision:
        """Pick one of ``workers`` (never empty) for ``req``."""
        ...


def _tie_break(workers: list[WorkerView], scores: dict[str, float]) -> Decision:
    """Lowest score; ties: fewer active+queued requests, then worker id."""
    best = min(workers, key=lambda w: (scores[w.id], w.n_requests, w.id))
    return Decision(best.id, scores)


class RoundRobin:
    name = "round_robin"

    def __init__(self) -> None:
        self._turn = itertools.count()

    def choose(self, req: RouteRequest, workers: list[WorkerView]) -> Decision:
        ordered = sorted(workers, key=lambda w: w.id)
        pick = ordered[next(self._turn) % len(ordered)]
        return Decision(pick.id, {w.id: float(w.id != pick.id) for w in ordered})


class LeastLoaded:
    """Fewest active + queued requests."""

    name = "least_loaded"

    def choose(self, req: RouteRequest, workers: list[WorkerView]) -> Decision:
        return _tie_break(workers, {w.id: float(w.n_requests) for w in workers})


class Forced:
    """Only workers whose id or device label equals the selector."""

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


class NoCandidate(LookupError):
    """No worker can take the request under this policy."""


def parse_policy(spec: str) -> Policy:
    """``round_robin`` | ``least_loaded`` | ``forced:<selector>`` | others from broker.scoring."""
    if spec.startswith("forced:"):
        return Forced(spec.split(":", 1)[1])
    simple: dict[str, type] = {"round_robin": RoundRobin, "least_loaded": LeastLoaded}
    from broker import scoring

    simple.update(scoring.POLICIES)
    if spec not in simple:
        raise ValueError(f"unknown policy {spec!r}; choose from {sorted(simple)} or forced:<sel>")
    return simple[spec]()
