"""``finish_time``: send a request where it is predicted to finish first.

For each candidate the router replays that worker's own scheduling rules
(workers/schedule.py, the functions its engine runs: FIFO admission under
``max_active``, a ``step_tokens`` budget per step spent on decode rows first,
then prefill chunks) forward from what it knows of the worker (each active and
queued request's remaining prefill and decode, after cache discounts), with
the new request appended to the queue and its cached prefix discounted. Every
step is timed with the worker's step-time model:

    step_s = prefill_tokens / prefill_rate + b / decode_rate(b) + step_overhead_s

where b is the number of decode rows and decode_rate(b) the aggregate decode
rate at that batch. The score is the predicted seconds until the new request's
last token. So a request added to a GPU already decoding 8 costs what batch 9
(or a wait for a free slot) really costs there, and the requests it would slow
down are priced through the same steps.

Steps that the engine would plan identically are advanced together
(``schedule.repeats``), so one prediction costs a few operations per request
on the worker rather than one per token.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import deque
from collections.abc import Sequence
from typing import Any

from tandem.broker.policies.views import Decision, RouteRequest, WorkerView, tie_break
from tandem.workers.schedule import admissible, decode_segments, plan_step, repeats

_NO_KV_LIMIT = 1 << 62  # the router's views carry no KV reservations: n_ctx is sized for max_active


class _Row:
    """One request as the predictor replays it: counters only (schedule.Schedulable)."""

    __slots__ = ("prefill_remaining", "decode_left", "decoding", "target")

    def __init__(self, prefill: int, decode: int, target: bool = False) -> None:
        self.prefill_remaining = prefill
        self.decode_left = decode  # output tokens still to produce
        self.decoding = prefill <= 0
        self.target = target


class StepModel:
    """Seconds of one engine step on one worker, from its view's rates."""

    __slots__ = ("prefill_rate", "decode_s", "overhead_s", "min_decode_s")

    def __init__(self, w: WorkerView) -> None:
        self.prefill_rate = w.prefill_rate
        top = max(1, min(w.max_active, len(w.decode_rates)))
        # A larger batch never decodes slower in aggregate: a rate below a smaller
        # batch's is a measuring stall (a profile once said 11 tok/s at batch 2 between
        # 180 and 332), so each rate is at least the best rate of the smaller batches.
        # (decode_rates[b - 1] is w.decode_rate(b) for every b <= top.)
        rates = list(itertools.accumulate(w.decode_rates[:top] or (w.decode_rate(1),), max))
        # Seconds of a decode step at batch b = b / aggregate rate; past the table the
        # aggregate rate plateaus (the step grows linearly), as the sim device assumes.
        self.decode_s = [0.0] + [b / r for b, r in enumerate(rates, 1)]
        self.overhead_s = float(getattr(w, "step_overhead_s", 0.0) or 0.0)
        # The least decode seconds of any step with b >= 1 rows (past the table a step
        # only grows): what ``_Memo.bound_s`` charges each decode step of a request.
        self.min_decode_s = min(self.decode_s[1:])

    def step_s(self, prefill_tokens: int, decode_rows: int) -> float:
        if decode_rows < len(self.decode_s):
            decode = self.decode_s[decode_rows]
        else:
            decode = self.decode_s[-1] * decode_rows / (len(self.decode_s) - 1)
        return prefill_tokens / self.prefill_rate + decode + self.overhead_s


Ahead = tuple[float, list[_Row], StepModel]


_MODELS: dict[tuple, StepModel] = {}  # by rates: a worker's view changes with each request


def step_model(w: WorkerView) -> StepModel:
    """``StepModel(w)``, shared by every view with the same rates (each assignment
    makes a new view, and a model of 256 batch sizes costs more than its lookup)."""
    key = (w.prefill_rate, w.decode_rates, w.max_active, getattr(w, "step_overhead_s", 0.0))
    model = _MODELS.get(key)
    if model is None:
        if len(_MODELS) >= 4096:
            _MODELS.clear()
        model = _MODELS[key] = StepModel(w)
    return model


def drain_ahead(w: WorkerView) -> Ahead:
    """(seconds, active rows) at the step in which a request queued now would be
    admitted on ``w``: the queue ahead of it drained and a slot free. Whatever the
    new request is, this part of the future is the same (FIFO: nothing overtakes)."""
    model = step_model(w)
    active = [_Row(x.prefill_remaining, x.decode_remaining) for x in w.active]
    active = [r for r in active if not (r.decoding and r.decode_left <= 0)]
    queue = deque(_Row(x.prefill_remaining, x.decode_remaining) for x in w.queued)
    step_tokens = max(w.step_tokens, w.max_active)  # as EngineConfig enforces: no stalled step
    t = 0.0
    while True:
        while queue and admissible(len(active), 0, 0, w.max_active, _NO_KV_LIMIT):
            active.append(queue.popleft())
        if not queue and admissible(len(active), 0, 0, w.max_active, _NO_KV_LIMIT):
            return t, active, model
        t += _advance(active, model, step_tokens)
        active = [r for r in active if not (r.decoding and r.decode_left <= 0)]


def _advance(
    active: Sequence[_Row], model: StepModel, step_tokens: int, within_s: float | None = None
) -> float:
    """Run the engine's next plan over ``active`` for as many steps as it repeats; seconds.
    ``within_s``: stop at the step that reaches this many seconds from now (one at least)."""
    plan = plan_step(active, step_tokens)
    k = repeats(plan, [r.decode_left for r in plan.decode])
    step_s = model.step_s(plan.prefill_tokens, len(plan.decode))
    if within_s is not None:
        k = min(k, max(1, math.ceil(within_s / step_s - 1e-9)))
    for r in plan.decode:
        r.decode_left -= k
    for r, n in plan.prefill:
        r.prefill_remaining -= k * n
        if r.prefill_remaining <= 0:  # the last chunk also yields the first token
            r.decoding = True
            r.decode_left -= 1
    return k * step_s


def predict_finish_s(req: RouteRequest, w: WorkerView, ahead: Ahead | None = None) -> float:
    """Seconds from now until ``req`` would end on ``w`` if it were queued there now.
    ``ahead``: ``drain_ahead(w)`` when the caller already has it (it is not changed)."""
    t, rows, model = ahead if ahead is not None else drain_ahead(w)
    active = [_Row(r.prefill_remaining, r.decode_left) for r in rows]
    for mine, theirs in zip(active, rows, strict=True):
        mine.decoding = theirs.decoding
    # The worker always computes >= 1 prompt token (it needs the last token's logits).
    target = _Row(max(1, req.prompt_tokens - w.cached_tokens), req.max_tokens, True)
    active.append(target)
    step_tokens = max(w.step_tokens, w.max_active)
    while True:
        if target.decoding and all(r.decoding for r in active):
            others = [r.decode_left for r in active if r is not target]
            segments = decode_segments(others, target.decode_left)
            return t + sum(k * model.step_s(0, b) for k, b in segments)
        t += _advance(active, model, step_tokens)
        if target.decoding and target.decode_left <= 0:
            return t
        active = [r for r in active if not (r.decoding and r.decode_left <= 0)]


class _Memo:
    """What ``FinishTime`` keeps on one view (``WorkerView.memo``): its step model, the
    prefill tokens ahead of a new request, the drain ahead (made on the first exact
    prediction: a pruned worker never needs it), answers and bounds by question."""

    __slots__ = ("model", "prefill_ahead", "ahead", "answers")

    def __init__(self, w: WorkerView) -> None:
        self.model = step_model(w)
        # May count a negative remainder, which only lowers the bound below.
        self.prefill_ahead = w.backlog[0]
        self.ahead: Ahead | None = None
        # By question: the predicted score (> 0: every prompt computes >= 1 token), or
        # minus its lower bound while only that is known (one lookup either way).
        self.answers: dict[tuple[int, int], float] = {}

    def bound_s(self, uncached: int, decode_steps: int) -> float:
        """A lower bound of ``predict_finish_s`` for a request with ``uncached`` prompt
        tokens to compute and ``decode_steps`` (= max_tokens - 1, >= 0) steps after its
        first token. Prefill chunks go in admission order, so by the request's first
        token every prompt token ahead of it has been computed, as has its own; every
        later step decodes it, at no less than the fastest step per batch; every step
        costs the overhead. Each step's time is the sum of those three parts."""
        m = self.model
        prefill_s = (self.prefill_ahead + uncached) / m.prefill_rate
        return prefill_s + decode_steps * m.min_decode_s + (decode_steps + 1) * m.overhead_s


# Floating-point slack: a bound and an exact score are sums of the same terms grouped
# differently, so a bound may exceed an equal score by rounding (~1e-15 per term).
_PRUNE_SLACK = 1e-9


class FinishTime:
    """Predicted finish time of the new request on each worker (see the module docstring).

    The drain of a worker's queue ahead of a new request does not depend on the
    request, and between two decisions of a burst only the chosen worker's view
    changes: each view keeps its drain, and the predictions made from it by the
    request's uncached prompt tokens and output budget (a burst of one shape asks
    the same question of every worker it did not change), in ``WorkerView.memo``,
    which lives until the worker changes. Memoized answers are the numbers the
    computation gives: decisions do not change.

    Branch and bound: a worker without a memoized answer is first given a cheap
    lower bound (``_Memo.bound_s``); they are predicted in order of bound, and those
    whose bound exceeds the ``KEEP``-th best score found (by more than rounding) are
    never predicted: their score could only be larger, so they can neither be
    chosen, nor tie, nor rank among the best ``KEEP``. Their ``Decision.scores``
    entry is that bound, and ``Decision.pruned`` names them (the decision log marks
    them). ``prune=False`` predicts every worker.
    """

    name = "finish_time"
    takes_any = True
    PER_VIEW = 64  # distinct questions kept per view
    # Candidates scored exactly whatever their bounds: a caller may rank this many by
    # score (lookahead compares its best 2 and places arrivals on its best 4).
    KEEP = 4

    def __init__(self, prune: bool = True) -> None:
        self.prune = prune

    def choose(self, req: RouteRequest, workers: list[WorkerView]) -> Decision:
        scores: dict[str, float] = {}
        prompt, budget = req.prompt_tokens, req.max_tokens
        decode_steps = max(0, budget - 1)
        # The best exact score so far and the workers that have it; the KEEP least
        # exact scores, and the bound above which a worker is pruned (inf until there
        # are KEEP of them, or while pruning is off).
        best, limit = math.inf, math.inf
        tied: list[WorkerView] = []
        least: list[float] = []
        keep = self.KEEP
        slack = 1.0 + _PRUNE_SLACK if self.prune else math.inf
        todo: list[tuple[float, WorkerView, _Memo, tuple[int, int]]] = []
        pruned: list[str] = []

        def exact(w: WorkerView, got: float) -> None:  # w's score is ``got``, exactly
            nonlocal best, tied, limit
            scores[w.id] = got
            if got <= best:
                if got < best:
                    best, tied = got, []
                tied.append(w)
            if len(least) < keep or got < least[-1]:
                limit = _admit(least, got, keep, slack)

        for w in workers:  # once per worker per request: a few lookups
            memo = w.memo.get("finish_time")
            if memo is None:
                memo = w.memo["finish_time"] = _Memo(w)
            uncached = prompt - w.cached_tokens
            question = (uncached if uncached > 1 else 1, budget)
            got = memo.answers.get(question)
            if got is None:
                if len(memo.answers) >= self.PER_VIEW:
                    memo.answers.clear()
                got = memo.answers[question] = -memo.bound_s(question[0], decode_steps)
            if got > 0.0:  # exact
                exact(w, got)
                continue
            bound = -got
            if bound > limit:  # best only falls: it stays pruned
                scores[w.id] = bound
                pruned.append(w.id)
            else:
                todo.append((bound, w, memo, question))
        todo.sort(key=_bound)  # stable: equal bounds in the workers' order
        for bound, w, memo, question in todo:
            if bound > limit:
                scores[w.id] = bound  # and so for every later one (sorted by bound)
                pruned.append(w.id)
                continue
            if memo.ahead is None:
                memo.ahead = drain_ahead(w)
            memo.answers[question] = got = predict_finish_s(req, w, memo.ahead)
            exact(w, got)
        # The least score's workers, found on the way: tie_break over them alone.
        decision = (
            Decision(tied[0].id, scores) if len(tied) == 1 else tie_break(tied or workers, scores)
        )
        if pruned:
            decision = Decision(decision.worker_id, scores, frozenset(pruned))
        return decision


def _bound(item: tuple[float, Any, Any, Any]) -> float:
    return item[0]


def _admit(least: list[float], score: float, keep: int, slack: float) -> float:
    """Put ``score`` among the ``keep`` least (sorted); the pruning limit they set."""
    bisect.insort(least, score)
    del least[keep:]
    return least[-1] * slack if len(least) == keep else math.inf
