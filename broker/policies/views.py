"""What every routing policy sees and returns: plain views of workers, the request, a decision.

A policy sees only plain data (``WorkerView``), built by the router from
heartbeats plus its own ledger, or read from a STATE.json by ``tandem route
explain``: both paths call the same ``choose``. Every policy returns a score per
candidate (lower is better) so decisions can be logged and explained.
"""

from __future__ import annotations

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
    step_tokens: int = 256  # the worker's per-step token budget (Ready.step_tokens)

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


def tie_break(workers: list[WorkerView], scores: dict[str, float]) -> Decision:
    """Lowest score; ties: fewer active+queued requests, then worker id."""
    best = min(workers, key=lambda w: (scores[w.id], w.n_requests, w.id))
    return Decision(best.id, scores)


class NoCandidate(LookupError):
    """No worker can take the request under this policy."""
