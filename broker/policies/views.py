"""What every routing policy sees and returns: plain views of workers, the request, a decision.

A policy sees only plain data (``WorkerView``), built by the router from
heartbeats plus its own ledger, or read from a STATE.json by ``tandem route
explain``: both paths call the same ``choose``. Every policy returns a score per
candidate (lower is better) so decisions can be logged and explained.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class Load:
    """One request already on a worker: work it still needs (after cache discounts)."""

    prefill_remaining: int
    decode_remaining: int


_FIELDS = ("id", "prefill_rate", "decode_rates", "max_active", "device", "cached_tokens",
           "active", "queued", "decode_context", "decode_context_s", "prefill_by_chunk",
           "step_tokens")  # fmt: skip


class WorkerView:
    """One worker as a policy sees it: plain values, read-only by convention.

    A plain class with slots, not a frozen dataclass: the router builds one per worker
    whose state moved, per decision, and a frozen dataclass's ``__init__`` costs
    several times a plain one's (docs/results/router-overhead.md). ``backlog`` and
    ``n_requests`` are computed as it is built (or ``backlog`` given: the router's
    running totals); ``memo`` and the ``with_cached`` copies are shared by a view and
    its copies, none of which depends on the prompt.
    """

    # __weakref__: finish_time remembers the views it last priced, weakly.
    __slots__ = (*_FIELDS, "backlog", "n_requests", "memo", "_copies", "_next_rate", "__weakref__")

    def __init__(
        self,
        id: str,  # noqa: A002 - the worker id, as everywhere else
        prefill_rate: float,  # tok/s, cold prefill
        decode_rates: tuple[float, ...],  # aggregate decode tok/s at batch size 1, 2, ...
        max_active: int = 4,
        device: str = "",
        cached_tokens: int = 0,  # tokens of the incoming prompt this worker already holds
        active: tuple[Load, ...] = (),
        queued: tuple[Load, ...] = (),
        # From the worker's live step-time model (common/pricing.py); the defaults mean
        # "not measured", and then step_s prices every context alike.
        decode_context: float = 0.0,  # context tokens per row at which decode_rates hold
        decode_context_s: float = 0.0,  # extra step seconds per context token per row
        prefill_by_chunk: tuple[tuple[int, float], ...] = (),  # (chunk tokens, tok/s)
        step_tokens: int = 256,  # the worker's per-step token budget (Ready.step_tokens)
        backlog: tuple[int, int] | None = None,  # (prefill, decode) tokens; None: summed
    ) -> None:
        self.id, self.prefill_rate, self.decode_rates = id, prefill_rate, decode_rates
        self.max_active, self.device, self.cached_tokens = max_active, device, cached_tokens
        self.active, self.queued = active, queued
        self.decode_context, self.decode_context_s = decode_context, decode_context_s
        self.prefill_by_chunk, self.step_tokens = prefill_by_chunk, step_tokens
        self.n_requests = len(active) + len(queued)
        if backlog is None:
            loads = active + queued
            backlog = (sum(x.prefill_remaining for x in loads),
                       sum(x.decode_remaining for x in loads))  # fmt: skip
        # Prefill and decode tokens still to do on this worker.
        self.backlog: tuple[int, int] = backlog
        # Scratch space for policies, as long-lived as this view (so: until the worker
        # changes); shared with its copies. Only what follows from the view's own
        # fields may be kept here.
        self.memo: dict[str, Any] = {}
        self._copies: dict[int, WorkerView] = {}  # with_cached's, by cached tokens
        self._next_rate = 0.0  # next_decode_rate, once read (0: not yet)

    def fields(self) -> dict[str, Any]:
        """The constructor's arguments that give this view (``backlog`` included)."""
        return {**{name: getattr(self, name) for name in _FIELDS}, "backlog": self.backlog}

    def replace(self, **changes: Any) -> WorkerView:
        """A new view with ``changes`` (its own memo; a changed load sums its backlog)."""
        given = self.fields()
        if "active" in changes or "queued" in changes:
            given["backlog"] = None
        return WorkerView(**{**given, **changes})

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, WorkerView):
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in (*_FIELDS, "backlog"))

    __hash__ = None  # type: ignore[assignment]  # equal by value, and not immutable

    def __repr__(self) -> str:
        shown = ", ".join(f"{n}={getattr(self, n)!r}" for n in _FIELDS)
        return f"WorkerView({shown})"

    def with_cached(self, cached_tokens: int) -> WorkerView:
        """This view for a prompt of which the worker holds ``cached_tokens``: a copy
        sharing ``memo``, the copies and the sums (none depends on the prompt)."""
        if cached_tokens == self.cached_tokens:
            return self
        copies = self._copies
        view = copies.get(cached_tokens)
        if view is None:
            view = WorkerView(
                self.id, self.prefill_rate, self.decode_rates, self.max_active, self.device,
                cached_tokens, self.active, self.queued, self.decode_context,
                self.decode_context_s, self.prefill_by_chunk, self.step_tokens, self.backlog,
            )  # fmt: skip
            view.memo, view._copies = self.memo, copies
            if len(copies) >= 8:
                copies.clear()
            copies[cached_tokens] = view
        return view

    @property
    def next_decode_rate(self) -> float:
        """Aggregate decode tok/s with one more request than it has now."""
        rate = self._next_rate
        if not rate:
            rate = self._next_rate = self.decode_rate(min(self.max_active, self.n_requests + 1))
        return rate

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
