"""``lookahead``: finish_time that expects the next arrivals.

finish_time (finish.py) is greedy: each request goes where it alone is predicted
to finish first, as if no other request were coming. On a worker whose
per-request speed rises with its batch (a launch-bound GPU: on the H200 box the
served step at batch 8 was no longer than at batch 1) that is myopic. The first
requests of a burst each finish sooner on an idle CPU, so the CPU fills up and
slows down, while the GPU batch they would have joined, which the later arrivals
fill anyway, would have carried them at full speed. In the twin, on the step
times the H200 served, finish_time priced right placed the 8-burst 10-24 %
behind the best placement at GPU max active 8 and 16 (docs/results/h200/).

This policy first scores every worker as finish_time does. When requests have
been arriving and one of the two best candidates is *batch-hungry* (its decode
step at max_active rows is no longer than at the batch the new request would
join, so arrivals yet to come would speed up the requests already there), it
compares those two candidates by a short rollout: the new request on the
candidate, then the arrivals the recent past predicts (as many in the next H
seconds as came in the last H, H = the new request's predicted finish; each
shaped like it, at the recent mean spacing), each placed where it adds least to
the total, every worker replayed forward by the engine's own schedule
(common/schedule.py) with each request joining at its arrival. The candidate
whose rollout has the smaller total of end times (the requests already on those
workers, the new one and the expected ones: the sum a mean latency divides)
wins; ties keep finish_time's order. Otherwise, and for the first request of a
burst, the policy places exactly as finish_time does.

Why these choices (measured in the twin on the step times the H200 served,
docs/ROUTING.md): the largest end time of the cohort as the objective, or each
expected arrival placed where it alone ends first, left the 8-bursts where they
were (the rollout inherits finish_time's myopia); a sum of end times prices what
a request does to the batch it joins. Without the hunger gate the rollout also
acted on open-loop traffic at GPU max active 4, where a batch never speeds its
rows up, and lost up to 9 % there.

Bounded: at most ``MAX_PER_S`` rollouts a second (beyond that arrival rate the
policy places as finish_time does), each over at most ``CANDIDATES`` x ``POOL``
workers and ``MAX_EXPECTED`` arrivals.

The forecast is the stationary one ("as many as in the same span before"): in a
burst of unknown size, the i-th request expects i - 1 more, which never expects
a flood that has not begun; and since the burst may end at any time, a
candidate is judged by the mean of its rollout's totals after none, half and all
of the expected arrivals (in the twin this kept the robustness suite at 64 of 64
rows, where the full forecast alone missed one: +7 % on an 8-burst whose last
request expected seven more).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence

from tandem.broker.policies.finish import (
    _NO_KV_LIMIT,
    FinishTime,
    _advance,
    _Row,
    context_extra_s,
    step_model,
)
from tandem.broker.policies.views import Decision, RouteRequest, WorkerView
from tandem.common.schedule import admissible, decode_runs

Extra = tuple[float, int, int]  # (arrival seconds from now, prompt tokens to compute, budget)


class _Timed(_Row):
    """A row whose end time is recorded (``end``: seconds from now)."""

    __slots__ = ("end",)

    def __init__(self, prefill: int, decode: int, target: bool) -> None:
        super().__init__(prefill, decode, target)
        self.end = math.inf


def finishes(w: WorkerView, extras: Sequence[Extra]) -> tuple[list[float], float]:
    """Seconds from now until each of ``extras`` ends on ``w``, each queued at its
    arrival behind what ``w`` already holds, by the engine's scheduling rules on the
    worker's step-time model (the same rules and step model as finish.py); and the
    sum of the end times of the requests ``w`` already holds."""
    model = step_model(w)
    step_tokens = max(w.step_tokens, w.max_active)
    held = [_Timed(x.prefill_remaining, x.decode_remaining, False) for x in (*w.active, *w.queued)]
    held = [r for r in held if not (r.decoding and r.decode_left <= 0)]
    active, queue = held[: len(w.active)], deque(held[len(w.active) :])
    rows = [_Timed(max(1, p), d, True) for _, p, d in extras]
    pending = deque(sorted(((e[0], i) for i, e in enumerate(extras)), key=lambda x: x[0]))
    t = 0.0
    while True:
        while pending and pending[0][0] <= t + 1e-12:
            queue.append(rows[pending.popleft()[1]])
        while queue and admissible(len(active), 0, 0, w.max_active, _NO_KV_LIMIT):
            active.append(queue.popleft())
        if not pending and not queue and all(r.decoding for r in active):
            # Only decoding is left: the batch shrinks at each end (schedule.decode_runs).
            ordered = sorted(active, key=lambda r: r.decode_left)
            runs, done = iter(decode_runs([r.decode_left for r in ordered])), 0
            for r in ordered:
                while done < r.decode_left:
                    steps, batch = next(runs)
                    t += steps * model.step_s(0, batch)
                    done += steps
                r.end = t
            break
        if not active:
            t = pending[0][0]  # idle until the next arrival
            continue
        # Stop at the next arrival's step: it may be admitted then.
        t += _advance(active, model, step_tokens, pending[0][0] - t if pending else None)
        for r in active:
            if r.decoding and r.decode_left <= 0:
                r.end = t
        active = [r for r in active if not (r.decoding and r.decode_left <= 0)]
    return [r.end for r in rows], sum(r.end for r in held)


def batch_hungry(w: WorkerView) -> bool:
    """Whether each request on ``w`` would decode at least as fast in a full batch as in
    the batch a new request joins now (its decode step no longer at max_active than at
    n + 1 rows, with room to grow): then arrivals yet to come speed up the ones
    already there."""
    steps = step_model(w).decode_s
    top = min(w.max_active, len(steps) - 1)
    joins = w.n_requests + 1
    # Equal steps count (up to rounding): past the largest batch it has run, pricing
    # holds a worker's step at most constant, and a flat step is what hunger means.
    return joins < top and steps[top] <= steps[joins] * (1.0 + 1e-9)


def expected_arrivals(req: RouteRequest, horizon_s: float, most: int) -> list[float]:
    """Arrival offsets (seconds from now) of the requests the recent past predicts
    within ``horizon_s``: as many as arrived in the last ``horizon_s``, at their mean
    spacing, at most ``most``."""
    seen = [a for a in req.arrivals_before if 0.0 <= a <= horizon_s]
    if not seen or horizon_s <= 0.0:
        return []
    gap = max(seen) / len(seen)
    return [gap * j for j in range(1, min(len(seen), most) + 1) if gap * j < horizon_s]


class Lookahead:
    """finish_time's scores, then a rollout of the expected arrivals between the best
    candidates (module docstring)."""

    name = "lookahead"
    takes_any = True
    CANDIDATES = 2  # the best finish_time candidates whose rollouts are compared
    POOL = 4  # the workers the expected arrivals may go to (the best by finish_time)
    MAX_EXPECTED = 8  # arrivals rolled out per decision
    # Rollouts are the costliest decisions the router makes (docs/ROUTING.md, "decision
    # cost"): past this many arrivals in the last second it decides as finish_time
    # does, so rollouts take a bounded share of a core.
    MAX_PER_S = 32

    def __init__(self) -> None:
        self.base = FinishTime()

    def choose(self, req: RouteRequest, workers: list[WorkerView]) -> Decision:
        base = self.base.choose(req, workers)
        recent = req.arrivals_before  # newest first
        if len(workers) < 2 or not recent:
            return base
        if len(recent) > self.MAX_PER_S and recent[self.MAX_PER_S] <= 1.0:
            return base  # more than MAX_PER_S arrivals in the last second
        scores = base.scores
        # finish_time's order (tie_break's key), the best POOL only: not a sort of all,
        # and the key (a Python tuple per worker) only for the workers whose
        # score is within the POOL least (found comparing floats in C).
        near = workers
        cut = heapq.nsmallest(self.POOL, scores.values())[-1]
        if cut == cut:  # not NaN, which orders nothing
            near = [w for w in workers if scores[w.id] <= cut]
        ranked = heapq.nsmallest(self.POOL, near, key=lambda w: (scores[w.id], w.n_requests, w.id))
        coming = expected_arrivals(req, scores[ranked[0].id], self.MAX_EXPECTED)
        if not coming:
            return base
        pool = ranked[: self.POOL]
        compared = ranked[: self.CANDIDATES]
        if not any(batch_hungry(w) for w in compared):
            return base
        # The burst may end at any time: each candidate is judged by the mean of its
        # rollout's totals after none, half and all of the expected arrivals (one
        # rollout: the arrivals are placed in turn, so each future is a prefix).
        futures = (0, len(coming) // 2, len(coming))
        outcome: dict[str, float] = {}
        seen: dict[tuple[str, tuple[Extra, ...]], float] = {}  # shared by the rollouts
        for c in compared:
            totals = self.rollout(req, c, pool, coming, seen)
            outcome[c.id] = sum(totals[k] for k in futures) / len(futures)
        # Shown as scores: each compared candidate's rollout total; the others rank
        # after them.
        last = max(outcome.values())
        shown = {w.id: outcome.get(w.id, max(last, scores[w.id])) for w in workers}
        best = min(compared, key=lambda w: (outcome[w.id], scores[w.id], w.n_requests, w.id))
        return Decision(best.id, shown, base.pruned)  # pruned ones rank after the compared

    def rollout(
        self,
        req: RouteRequest,
        first: WorkerView,
        pool: list[WorkerView],
        coming: list[float],
        seen: dict[tuple[str, tuple[Extra, ...]], float],
    ) -> list[float]:
        """The sum of end times (seconds from now) of every request on ``pool`` once
        the new request is on ``first`` and then after each of the ``coming``
        arrivals, in turn, on the worker where it adds least to that sum: entry j
        counts the first j arrivals. ``seen``: replays by (worker, extras), kept by
        the caller across rollouts."""
        placed: dict[str, list[Extra]] = {w.id: [] for w in pool}
        totals: dict[str, float] = {}

        def total(w: WorkerView, extras: list[Extra]) -> float:
            key = (w.id, tuple(extras))
            if key not in seen:
                mine, held = finishes(w, extras)
                # Each of them (the request's shape) at its own context, as finish_time.
                own = context_extra_s(w, req.prompt_tokens, req.max_tokens, step_model(w))
                seen[key] = held + sum(mine) + len(mine) * own
            return seen[key]

        def shaped(w: WorkerView, at: float) -> Extra:
            return (at, max(1, req.prompt_tokens - w.cached_tokens), req.max_tokens)

        placed[first.id].append(shaped(first, 0.0))
        for w in pool:
            totals[w.id] = total(w, placed[w.id])
        out = [sum(totals.values())]
        for at in coming:
            options = []
            for w in pool:
                mine = shaped(w, at)
                added = total(w, [*placed[w.id], mine]) - totals[w.id]
                options.append((added, w.n_requests, w.id, mine))
            added, _, wid, mine = min(options)
            placed[wid].append(mine)
            totals[wid] += added
            out.append(sum(totals.values()))
        return out
