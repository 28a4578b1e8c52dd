"""What every routing policy sees and returns: plain views of workers, the request, a decision.

A policy sees only plain data (``WorkerView``), built by the router from
heartbeats plus its own ledger, or read from a STATE.json by ``tandem route
explain``: both paths call the same ``choose``. Every policy returns a score per
candidate (lower is better) so decisions can be logged and explained.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar, overload

T = TypeVar("T")


class cached_property(Generic[T]):  # noqa: N801 - functools' name, functools' use
    """``functools.cached_property`` without its lock: Python 3.11's takes an RLock on
    each first access (~3 us), three per fresh view, so most of a decision over 256
    new views. Views are built and read on one thread."""

    def __init__(self, fn: Callable[[Any], T]) -> None:
        self.fn = fn
        self.name = fn.__name__
        self.__doc__ = fn.__doc__

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> cached_property[T]: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> T: ...
    def __get__(self, obj: object | None, owner: type | None = None) -> Any:
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.fn(obj)  # found there from now on
        return value


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
    # From the worker's live step-time model (common/pricing.py); the defaults mean
    # "not measured", and then step_s prices every context alike.
    decode_context: float = 0.0  # context tokens per row at which decode_rates hold
    decode_context_s: float = 0.0  # extra step seconds per context token per decoding row
    prefill_by_chunk: tuple[tuple[int, float], ...] = ()  # (chunk bucket tokens, tok/s) measured
    step_tokens: int = 256  # the worker's per-step token budget (Ready.step_tokens)

    @classmethod
    def of(cls, **fields: Any) -> WorkerView:
        """The view with these fields, every one of them given (and any cached property
        values to share, as ``with_cached`` gives), built without the frozen class's
        ``__init__`` (4.4 against 0.7 us; the router builds one per worker whose state
        moved, per decision)."""
        view = object.__new__(cls)
        view.__dict__.update(fields)
        return view

    # Cached per view: the router reuses a view across decisions until the worker changes.
    @cached_property
    def memo(self) -> dict[str, Any]:
        """Scratch space for policies, as long-lived as this view (so: until the worker
        changes); ``with_cached`` copies share it. Only what follows from the view's
        own fields may be kept here."""
        return {}

    def with_cached(self, cached_tokens: int) -> WorkerView:
        """This view for a prompt of which the worker holds ``cached_tokens``: a shallow
        copy (``dataclasses.replace`` re-runs ``__init__``: 10 us per view per decision;
        ``copy.copy`` 5 us, this ~1), sharing every cached property, none of which
        depends on the prompt."""
        if cached_tokens == self.cached_tokens:
            return self
        copies = self._copies
        view = copies.get(cached_tokens)
        if view is None:
            _ = self.memo, self._copies  # made before the copy, so that the copy shares them
            view = type(self).of(**{**self.__dict__, "cached_tokens": cached_tokens})
            if len(copies) >= 8:
                copies.clear()
            copies[cached_tokens] = view
        return view

    @cached_property
    def _copies(self) -> dict[int, WorkerView]:
        """``with_cached``'s copies by cached tokens (made before any copy, so shared:
        a burst with one prefix asks a worker for the same copy at each decision)."""
        return {}

    @cached_property
    def n_requests(self) -> int:
        return len(self.active) + len(self.queued)

    @cached_property
    def backlog(self) -> tuple[int, int]:
        """Prefill and decode tokens still to do on this worker (summed here, unless
        the view was built from the router's running totals, which fill it in)."""
        loads = self.active + self.queued
        return sum(x.prefill_remaining for x in loads), sum(x.decode_remaining for x in loads)

    @cached_property
    def next_decode_rate(self) -> float:
        """Aggregate decode tok/s with one more request than it has now."""
        return self.decode_rate(min(self.max_active, self.n_requests + 1))

    def decode_rate(self, batch: int) -> float:
        """Aggregate decode tok/s when ``batch`` requests decode together."""
        b = max(1, min(batch, self.max_active, len(self.decode_rates)))
        return self.decode_rates[b - 1]

    def step_s(self, batch: int, context: float | None = None) -> float:
        """Seconds of one decode step of ``batch`` rows with ``context`` tokens of
        context per row (None: the context the rates were measured at). Past
        max_active the batch cannot grow: the worker runs max_active rows."""
        b = max(1, min(batch, self.max_active))
        base = b / self.decode_rate(b)
        if context is None or not self.decode_context_s:
            return base
        # Never below a fifth of the measured step: the fit is linear, not physics.
        return max(0.2 * base, base + self.decode_context_s * b * (context - self.decode_context))


@dataclass(frozen=True)
class RouteRequest:
    prompt_tokens: int
    max_tokens: int
    # How long before this request each recent client request arrived (seconds,
    # newest first; broker/arrivals.py): what a policy may expect of the next ones.
    arrivals_before: tuple[float, ...] = ()


@dataclass(frozen=True)
class Decision:
    worker_id: str
    scores: dict[str, float] = field(default_factory=dict)
    # Candidates never scored exactly: their ``scores`` entry is a lower bound that
    # already exceeds the chosen score (finish_time's branch and bound).
    pruned: frozenset[str] = frozenset()


class Policy(Protocol):
    name: str
    # Whether a lone candidate is always this policy's choice (then the router skips
    # scoring it). False for a policy that may refuse every worker it is shown.
    takes_any: bool

    def choose(self, req: RouteRequest, workers: list[WorkerView]) -> Decision:
        """Pick one of ``workers`` (never empty) for ``req``."""
        ...


def tie_break(workers: list[WorkerView], scores: dict[str, float]) -> Decision:
    """Lowest score; ties: fewer active+queued requests, then worker id."""
    low = min(scores[w.id] for w in workers)
    if low == low:  # not NaN (which min orders by position): the tied few, by key
        tied = [w for w in workers if scores[w.id] == low]
        if len(tied) == 1:
            return Decision(tied[0].id, scores)
        workers = tied
    best = min(workers, key=lambda w: (scores[w.id], w.n_requests, w.id))
    return Decision(best.id, scores)


class NoCandidate(LookupError):
    """No worker can take the request under this policy."""
