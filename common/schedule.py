"""The worker's scheduling rules, as pure functions over request counters.

The engine (workers/engine.py) runs them on its live requests, one step at a
time; the router's finish-time predictor (broker/policies/finish.py) and the
twin (twin/) run the very same functions forward on plain counters. Keeping
them in one place is what makes a prediction mean "what this worker will do",
not a second formula that drifts from the engine. They live in common/ because
both processes run them: the router must not import the worker's room.

The rules:

- Admission is FIFO: the queue's head is admitted while fewer than
  ``max_active`` requests are active and every active request's reservation
  (prompt + output budget) plus the head's fits in the KV cells (``n_ctx``).
  A head that does not fit blocks the queue (no overtaking).
- One step spends ``step_tokens``: every decoding request feeds one token
  first, then the prefilling requests take chunks of what is left, in the
  order they were admitted. While requests decode, the chunks also stay within
  a time budget (``chunk_cap``: ``StepModel.prefill_budget``), so that a
  decoding stream waits at most one such step for a prompt.
- A prefill's last chunk also yields its first output token; every decode step
  yields one more; a request ends when it has ``max_tokens`` output tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar


class Schedulable(Protocol):
    """What planning reads of a request: is it decoding, how much prompt is left."""

    @property
    def decoding(self) -> bool: ...

    @property
    def prefill_remaining(self) -> int: ...


R = TypeVar("R", bound=Schedulable)


@dataclass
class StepPlan(Generic[R]):
    """One step: the requests that decode a token, and prompt chunks (request, tokens)."""

    decode: list[R] = field(default_factory=list)
    prefill: list[tuple[R, int]] = field(default_factory=list)

    @property
    def prefill_tokens(self) -> int:
        return sum(n for _, n in self.prefill)

    def __bool__(self) -> bool:
        return bool(self.decode or self.prefill)


def reservation(prompt_tokens: int, max_tokens: int, prefill_only: bool) -> int:
    """KV cells a request may come to hold: its prompt and (unless prefill-only) its budget."""
    return prompt_tokens + (0 if prefill_only else max_tokens)


def admissible(
    n_active: int, reserved: int, head_reservation: int, max_active: int, n_ctx: int
) -> bool:
    """Whether the queue's head may start now (see the module docstring)."""
    return n_active < max_active and reserved + head_reservation <= n_ctx


def plan_step(active: Sequence[R], step_tokens: int, chunk_cap: int | None = None) -> StepPlan[R]:
    """The work of the next step over ``active`` (in admission order); with decode
    rows, the prompt tokens it takes are at most ``chunk_cap`` (a time budget)."""
    plan: StepPlan[R] = StepPlan([r for r in active if r.decoding])
    budget = step_tokens - len(plan.decode)
    if plan.decode and chunk_cap is not None:
        budget = min(budget, chunk_cap)
    for r in active:
        if budget <= 0:
            break
        if not r.decoding:
            n = min(r.prefill_remaining, budget)
            plan.prefill.append((r, n))
            budget -= n
    return plan


def repeats(plan: StepPlan[R], decode_left: Sequence[int]) -> int:
    """How many consecutive steps, this one included, the engine plans exactly alike.

    ``decode_left``: the decode steps each of ``plan.decode`` still needs. The
    plan changes only when a request ends its prefill or its output (nothing is
    admitted in between: admission needs a free slot, and only an end frees one),
    so the same plan repeats until the first of those. A predictor may then
    advance that many steps at once instead of one by one.
    """
    n = min(decode_left, default=1 << 62)
    if plan.prefill:
        if len(plan.prefill) > 1:
            return 1  # an earlier chunk ends its request in this very step
        r, chunk = plan.prefill[0]
        n = min(n, max(1, r.prefill_remaining // chunk))
    return max(1, n)


def decode_runs(decode_left: Sequence[int]) -> list[tuple[int, int]]:
    """(steps, batch) runs of a batch that only decodes, with nothing queued, until its
    last row ends: every step feeds every row, and a row leaves after its last token,
    so the batch shrinks at each end and a run ends where some row does. The same as
    planning step by step (``plan_step`` with ``repeats``), in one pass over the
    sorted ends."""
    out = []
    batch, done = len(decode_left), 0
    for left in sorted(decode_left):
        if left > done:
            out.append((left - done, batch))
            done = left
        batch -= 1
    return out


def decode_segments(decode_left: Sequence[int], until: int) -> list[tuple[int, int]]:
    """``decode_runs`` of the other rows ``decode_left`` and one with ``until`` tokens
    left, up to that row's end (a row still decoding then is in every run)."""
    return decode_runs([*(min(left, until) for left in decode_left), until])
