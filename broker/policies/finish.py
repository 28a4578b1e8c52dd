"""``finish_time``: send a request where it is predicted to finish first.

For each candidate the router replays that worker's own scheduling rules
(common/schedule.py, the functions its engine runs: FIFO admission under
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

Decode slows with context, and the step model quotes its steps at the context
its rows served at (``decode_context``) with a slope (``decode_context_s``,
seconds per context token per row: common/steptime.py). The new request's own
row adds ``slope * (its context - decode_context)`` to each decode step it is
in: a long prompt on a CPU that just served short ones costs more than the
quoted steps, a short one less. Its context at its j-th decode step is its
prompt plus j - 1 output tokens whatever the schedule, so that term is one sum
per request (``context_extra_s``), added to the replayed time. (The other rows
are priced at the quoted context: they are what it was measured on.)
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
import weakref
from collections import deque
from collections.abc import Sequence
from itertools import compress, repeat
from operator import call, eq, is_not, not_, or_

from tandem.broker.policies.ranked import Ranked
from tandem.broker.policies.views import Decision, RouteRequest, WorkerView, tie_break
from tandem.common.schedule import admissible, decode_segments, plan_step, repeats
from tandem.common.validation import MIN_STEP_S

_NO_KV_LIMIT = 1 << 62  # the router's views carry no KV reservations: n_ctx is sized for max_active


class _Row:
    """One request as the predictor replays it: counters only (schedule.Schedulable)."""

    __slots__ = ("prefill_remaining", "decode_left", "decoding", "target")

    def __init__(
        self, prefill: int, decode: int, target: bool = False, decoding: bool | None = None
    ) -> None:
        self.prefill_remaining = prefill
        self.decode_left = decode  # output tokens still to produce
        self.decoding = prefill <= 0 if decoding is None else decoding
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


# (seconds, rows, step model) once the queue ahead of a new request has drained; each
# row as (prefill_remaining, decode_left, decoding): a template every replay makes its
# own _Rows from (one object per row per prediction, not two).
Ahead = tuple[float, list[tuple[int, int, bool]], StepModel]


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
    unfinished = [x for x in w.active if x.prefill_remaining > 0 or x.decode_remaining > 0]
    if len(unfinished) + len(w.queued) < w.max_active:  # all admitted now, a slot free
        return 0.0, [(x.prefill_remaining, x.decode_remaining, x.prefill_remaining <= 0)
                     for x in (*unfinished, *w.queued)], model  # fmt: skip
    active = [_Row(x.prefill_remaining, x.decode_remaining) for x in unfinished]
    queue = deque(_Row(x.prefill_remaining, x.decode_remaining) for x in w.queued)
    step_tokens = max(w.step_tokens, w.max_active)  # as EngineConfig enforces: no stalled step
    t = 0.0
    while True:
        while queue and admissible(len(active), 0, 0, w.max_active, _NO_KV_LIMIT):
            active.append(queue.popleft())
        if not queue and admissible(len(active), 0, 0, w.max_active, _NO_KV_LIMIT):
            return t, [(r.prefill_remaining, r.decode_left, r.decoding) for r in active], model
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
        k = min(k, max(1, math.ceil(within_s / max(step_s, MIN_STEP_S) - 1e-9)))
    for r in plan.decode:
        r.decode_left -= k
    for r, n in plan.prefill:
        r.prefill_remaining -= k * n
        if r.prefill_remaining <= 0:  # the last chunk also yields the first token
            r.decoding = True
            r.decode_left -= 1
    return k * step_s


def context_extra_s(w: WorkerView, prompt_tokens: int, max_tokens: int, model: StepModel) -> float:
    """Seconds the request's own context adds to the decode steps it is in on ``w``
    (negative for a context below the one ``w``'s steps are quoted at): with slope k
    and quoted context c, each of its ``max_tokens - 1`` decode steps costs
    ``k * (prompt_tokens + j - c)`` more, j = 0, 1, ... output tokens fed.

    A slope is a worker's word, so it is held to what its own steps allow: one row's
    context cost ``k * c`` is part of the batch-1 step quoted at c, so k is at most
    that step over c (a slope of 1e-3 s per token, say, would price a long prompt
    there at minutes and a short one at nothing). And never more than the fastest
    decode step off per step, so the score stays > 0."""
    k, m, c = w.decode_context_s, max_tokens - 1, w.decode_context
    if not k or m <= 0 or c <= 0:  # no slope, nothing to decode, or no context measured
        return 0.0
    k = min(k, model.decode_s[1] / c)
    extra = k * (m * (prompt_tokens - c) + m * (m - 1) / 2)
    return max(extra, -m * model.min_decode_s)


def predict_finish_s(req: RouteRequest, w: WorkerView, ahead: Ahead | None = None) -> float:
    """Seconds from now until ``req`` would end on ``w`` if it were queued there now.
    ``ahead``: ``drain_ahead(w)`` when the caller already has it (it is not changed)."""
    t, rows, model = ahead if ahead is not None else drain_ahead(w)
    return _replay_finish_s(req, w, t, rows, model) + context_extra_s(
        w, req.prompt_tokens, req.max_tokens, model
    )


def _replay_finish_s(
    req: RouteRequest, w: WorkerView, t: float, rows: list[tuple[int, int, bool]], model: StepModel
) -> float:
    """``predict_finish_s`` with every step at its quoted context: the engine's plan
    replayed over the rows ahead's and the new request's."""
    active = [_Row(prefill, decode, False, decoding) for prefill, decode, decoding in rows]
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


class _Writes:
    """Every write to any memo's answers, counted (``FinishTime._answers`` trusts the
    answers it kept only while nothing else wrote). An instance's attribute: a class
    attribute written per answer would reset the type's attribute caches each time
    (memo attribute reads ~1.5x slower)."""

    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 0


WRITES = _Writes()


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
        self.answers: dict[tuple[int, int, int], float] = {}

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


_ZERO = 0.0  # its ``__lt__`` tells the exact scores (> 0) from the bounds (<= 0), in C

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
    computation gives: decisions do not change. A decision also keeps its answers by
    position for the next one of the same (prompt, budget): of a burst's 256
    workers, only those whose view is a new object are asked (``_answers``).

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
    # Moving an answer in the kept order costs ~2 us, a pass over the fleet in C
    # ~0.3 us a worker: past this share of workers changed, a decision passes over
    # them all (the order is dropped, and remade by a later burst decision).
    RANKED_CHANGED = 0.125

    def __init__(self, prune: bool = True) -> None:
        self.prune = prune
        # The last decision's answers by position (``_answers``), reused by the next one
        # with the same question shape (a burst): only the views that changed are asked.
        self._shape: tuple[int, int] | None = None
        # Weakly: a view kept alive past its worker's next change would keep the
        # allocator from reusing its memory for the new ones (+10-35 % on a decision
        # after a round of heartbeats); a dead view reads as None, changed.
        self._views: list[weakref.ref[WorkerView]] = []
        self._ids: list[str] = []
        self._gots: list[float] = []
        self._keys: list[tuple[int, str]] = []  # (n_requests, id) by position: tie_break's
        self._writes = -1  # WRITES.n when they were taken
        # The kept answers in order (ranked.py): made on the second decision of a
        # shape, then moved as answers change; None while answers are not kept.
        self._ranked: Ranked | None = None
        # Whether the last ``_answers`` reused the kept answers, few of them changed.
        self._kept = False

    def choose(self, req: RouteRequest, workers: list[WorkerView]) -> Decision:
        # One pass in the workers' order would admit each exact answer, prune each bound
        # above the limit so far and queue the others, then predict the queue in order
        # of bound. The limit only falls, so that is: every exact answer admitted, then
        # the bounds in order (ties: the workers' order) against the limit they leave.
        gots = self._answers(req, workers)
        ids, keep = self._ids, self.KEEP
        if self._kept and self.prune:  # a burst: decided from the kept order
            ranked = self._ranked
            if ranked is None and all(map(Ranked.orderable, gots)):
                ranked = self._ranked = Ranked(gots, self._keys, ids)
            if ranked is not None:
                return self._choose_ranked(req, workers, ranked)
        # The exact scores' least few, and the workers with only a bound: each a pass
        # in C over the fleet (at 1,024 workers a pass in Python was ~100 us).
        least = heapq.nsmallest(keep, filter(_ZERO.__lt__, gots))
        best = least[0] if least else math.inf
        slack = 1.0 + _PRUNE_SLACK if self.prune else math.inf
        limit = least[-1] * slack if len(least) == keep else math.inf
        # A bound past the limit is pruned (g < -limit: never an exact score, > 0);
        # the other bounds, NaN included, are predicted in order of bound.
        past = (-limit).__gt__
        pruned = list(compress(ids, map(past, gots)))
        within = map(not_, map(or_, map(_ZERO.__lt__, gots), map(past, gots)))
        todo = sorted([(-gots[i], i) for i in compress(range(len(gots)), within)])
        for k, (bound, i) in enumerate(todo):
            if bound > limit:  # and so for every later one (sorted by bound)
                pruned.extend(ids[j] for _, j in todo[k:])
                break
            w = workers[i]
            memo: _Memo = w.memo["finish_time"]
            if memo.ahead is None:
                memo.ahead = drain_ahead(w)
            got = predict_finish_s(req, w, memo.ahead)
            memo.answers[_question(req.prompt_tokens, w, req.max_tokens)] = gots[i] = got
            WRITES.n += 1
            best = min(best, got)
            if len(least) < keep or got < least[-1]:
                limit = _admit(least, got, keep, slack)
        self._writes = WRITES.n
        scores = dict(zip(ids, map(abs, gots), strict=True))  # a pruned one's: its bound
        # The least score's workers: tie_break over them alone (count: one pass in C;
        # it would match a NaN by identity, which ``==`` never does).
        if best == best and gots.count(best) == 1:
            decision = Decision(ids[gots.index(best)], scores)
        elif best == best:  # tie_break's order among the tied: (requests, id), in C
            _, wid = min(compress(self._keys, map(eq, gots, repeat(best))))
            decision = Decision(wid, scores)
        else:
            decision = tie_break(workers, scores)
        if pruned:
            decision = Decision(decision.worker_id, scores, frozenset(pruned))
        return decision

    def _answers(self, req: RouteRequest, workers: list[WorkerView]) -> list[float]:
        """Each worker's memoized answer to ``req``: its score (> 0: every prompt
        computes >= 1 token), or minus a lower bound (``_Memo.bound_s``) while only that
        is known; a bound is memoized as it is made. The list is kept for the next
        decision: when it asks the same (prompt, budget) and no memo was written since
        by anyone else, the workers whose view is the same object keep their answer
        (one view's memo changes only through this class), and only the rest are
        asked. Decisions are those of asking every worker each time."""
        prompt, budget = req.prompt_tokens, req.max_tokens
        shape = (prompt, budget)
        n = len(workers)
        kept = shape == self._shape and WRITES.n == self._writes and n == len(self._views)
        self._shape = None  # until this call ends: one that raises leaves nothing to trust
        ranked, self._ranked, self._kept = self._ranked, None, kept
        if kept:
            gots, ids, refs, keys = self._gots, self._ids, self._views, self._keys
            then = list(map(call, refs))
            changed: Sequence[int] = list(compress(range(n), map(is_not, workers, then)))
            del then
            for i in changed:
                refs[i] = weakref.ref(workers[i])
            if len(changed) > n * self.RANKED_CHANGED:  # cheaper to pass over them all
                ranked = None
                self._kept = False
        else:
            gots, ids, refs = [0.0] * n, [""] * n, list(map(weakref.ref, workers))
            keys = [(0, "")] * n
            changed, ranked = range(n), None
        decode_steps = max(0, budget - 1)
        for i in changed:  # once per changed worker per request: a few lookups
            w = workers[i]
            memo = w.memo.get("finish_time")
            if memo is None:
                memo = w.memo["finish_time"] = _Memo(w)
            question = _question(prompt, w, budget)
            got = memo.answers.get(question)
            if got is None:
                if len(memo.answers) >= self.PER_VIEW:
                    memo.answers.clear()
                bound = memo.bound_s(question[0], decode_steps)
                if w.decode_context_s:  # as in the score (tested here: most views have none)
                    bound += context_extra_s(w, prompt, budget, memo.model)
                got = memo.answers[question] = -bound
                WRITES.n += 1
            if ranked is not None:  # moved in the kept order (a new worker there: remade)
                if ids[i] == w.id and Ranked.orderable(got):
                    ranked.remove(gots[i], keys[i], i)
                    ranked.add(got, (w.n_requests, w.id), i)
                else:
                    ranked = None
            gots[i], ids[i], keys[i] = got, w.id, (w.n_requests, w.id)
        self._shape, self._views, self._gots, self._ids = shape, refs, gots, ids
        self._keys, self._ranked = keys, ranked
        return gots

    def _choose_ranked(
        self, req: RouteRequest, workers: list[WorkerView], ranked: Ranked
    ) -> Decision:
        """``choose`` from the kept order: the bounds at or below the limit predicted in
        order of bound (each moving the limit), the rest pruned; the first exact entry
        is tie_break's choice. The decision ``choose``'s passes over the fleet give."""
        gots, ids, keys, bounds = self._gots, self._ids, self._keys, ranked.bounds
        slack = 1.0 + _PRUNE_SLACK
        limit = ranked.limit(self.KEEP, slack)
        while bounds and not bounds[0][0] > limit:
            _, i = bounds[0]
            w = workers[i]
            memo: _Memo = w.memo["finish_time"]
            if memo.ahead is None:
                memo.ahead = drain_ahead(w)
            got = predict_finish_s(req, w, memo.ahead)
            memo.answers[_question(req.prompt_tokens, w, req.max_tokens)] = got
            WRITES.n += 1
            if not (got > 0.0):  # NaN (or a bug): ordered no more; the kept answers say so
                gots[i], self._ranked, self._writes = got, None, WRITES.n
                return self.choose(req, workers)
            del bounds[0]
            gots[i] = got
            ranked.add(got, keys[i], i)
            limit = ranked.limit(self.KEEP, slack)
        self._writes = WRITES.n
        pruned = frozenset([ids[i] for _, i in bounds])
        # A copy: the kept scores move with the next decision, this one's do not.
        return Decision(ranked.exact[0][2], dict(ranked.scores), pruned)


def _question(prompt_tokens: int, w: WorkerView, budget: int) -> tuple[int, int, int]:
    """What a memo answers: the prompt tokens ``w`` must compute (>= 1), the budget,
    and the whole prompt where ``w``'s steps slow with context (else 0)."""
    uncached = prompt_tokens - w.cached_tokens
    return (uncached if uncached > 1 else 1, budget, prompt_tokens if w.decode_context_s else 0)


def _admit(least: list[float], score: float, keep: int, slack: float) -> float:
    """Put ``score`` among the ``keep`` least (sorted); the pruning limit they set."""
    bisect.insort(least, score)
    del least[keep:]
    return least[-1] * slack if len(least) == keep else math.inf
