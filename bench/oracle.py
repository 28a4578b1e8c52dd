"""The oracle bound: the shortest makespan any assignment of the run's requests to
its workers could reach, under a throughput model of each worker.

Model (per worker w, from its *measured* rates, see bench/calibrate.py):

- ``R_w``: cold prefill tok/s; ``D1_w``: decode tok/s of one request alone;
  ``Dpk_w``: aggregate decode tok/s at its full batch (``max_active`` requests).
- A request i (arrival a_i, p_i uncached prompt tokens, n_i output tokens) on w
  cannot finish before ``a_i + lat_i`` with ``lat_i = p_i/R_w + (n_i-1)/D1_w``:
  its own prefill, then one decode step per further token, no step faster than
  a batch-1 step (the first token comes out of the prefill step).
- Work: a worker never runs faster than ``R_w`` prefill plus ``Dpk_w`` decode,
  so a request costs it at least ``work_i = p_i/R_w + (n_i-1)/Dpk_w`` seconds,
  and for every arrival time t it cannot finish before t plus the work of the
  requests it got that arrive at or after t (work cannot start before arrival).

The bound of an assignment is the largest of those finish times over workers;
the oracle is its minimum over all assignments (requests are whole: one worker
each), measured from the first arrival, like the makespan. Assumptions: the
rates hold whatever else runs on the machine (no contention between workers),
prefill and decode of one step cost the sum of their parts (true of the sim;
roughly true of llama.cpp, whose batches mix both), cached tokens are the same
on every worker (every worker is seeded with the same prefix), and no routing
or messaging overhead. So measured / oracle >= 1 up to rate noise; the ratio
says how much of the makespan any router could still win.

Search: bisection on the makespan T; for a given T a dynamic program over the
requests in reverse arrival order keeps the Pareto front of per-worker suffix
work (states within ``tol_s`` merged), so the result is exact to about ``tol_s``
per request. A front larger than ``max_states`` (many workers, many distinct
requests) is cut to its most balanced states: then ``exact`` is false and the
value may sit a little above the true minimum.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WorkerRates:
    prefill_tok_s: float
    decode_tok_s_1: float  # one request alone
    decode_tok_s_peak: float  # aggregate at the full batch

    def __post_init__(self) -> None:
        if min(self.prefill_tok_s, self.decode_tok_s_1, self.decode_tok_s_peak) <= 0:
            raise ValueError("rates must be > 0")


@dataclass(frozen=True)
class Job:
    arrival_s: float
    prefill_tokens: int  # uncached prompt tokens (>= 1)
    output_tokens: int


@dataclass(frozen=True)
class OracleResult:
    makespan_s: float
    requests: dict[str, int]  # how many requests the best assignment gives each worker
    exact: bool


_State = tuple[tuple[float, ...], tuple[int, ...]]  # (suffix work per worker, counts)


def job_costs(job: Job, r: WorkerRates) -> tuple[float, float]:
    """(latency lower bound, work) of one job on one worker, seconds."""
    prefill = max(1, job.prefill_tokens) / r.prefill_tok_s
    decode = max(0, job.output_tokens - 1)
    return prefill + decode / r.decode_tok_s_1, prefill + decode / r.decode_tok_s_peak


def oracle_bound(
    jobs: list[Job],
    workers: dict[str, WorkerRates],
    tol_s: float = 1e-3,
    max_states: int = 1500,
) -> OracleResult:
    """The minimum over assignments of the model's makespan bound (module docstring)."""
    if not jobs or not workers:
        raise ValueError("need at least one job and one worker")
    ids = sorted(workers)
    t0 = min(j.arrival_s for j in jobs)
    order = sorted(jobs, key=lambda j: j.arrival_s)
    arr = [j.arrival_s - t0 for j in order]
    costs = [[job_costs(j, workers[w]) for w in ids] for j in order]
    lo = max(a + min(c[0] for c in cs) for a, cs in zip(arr, costs, strict=True))
    hi, counts = _greedy(arr, costs, len(ids))
    exact = True
    while hi - lo > tol_s:
        mid = (lo + hi) / 2
        found, capped = _feasible(mid, arr, costs, len(ids), max_states, grid_s=tol_s)
        exact = exact and not capped
        if found is None:
            lo = mid
        else:
            hi, counts = mid, found
    return OracleResult(hi, dict(zip(ids, counts, strict=True)), exact)


def assignment_bound(arr: list[float], costs_on: list[tuple[float, float]]) -> float:
    """The model's finish time of one worker given its jobs (arrival-sorted) and costs."""
    finish, work = 0.0, 0.0
    for a, (lat, w) in zip(reversed(arr), reversed(costs_on), strict=True):
        work += w
        finish = max(finish, a + lat, a + work)
    return finish


def _greedy(
    arr: list[float], costs: list[list[tuple[float, float]]], k: int
) -> tuple[float, tuple[int, ...]]:
    """A feasible upper start: each job, in arrival order, to the worker it ends soonest on."""
    busy = [0.0] * k  # fluid finish time of each worker's work so far
    picks: list[list[int]] = [[] for _ in range(k)]
    for i, a in enumerate(arr):
        best = min(range(k), key=lambda w: max(busy[w], a) + costs[i][w][1] + costs[i][w][0])
        busy[best] = max(busy[best], a) + costs[i][best][1]
        picks[best].append(i)
    bound = max(
        assignment_bound([arr[i] for i in p], [costs[i][w] for i in p]) if p else 0.0
        for w, p in enumerate(picks)
    )
    return bound, tuple(len(p) for p in picks)


def _feasible(
    t: float,
    arr: list[float],
    costs: list[list[tuple[float, float]]],
    k: int,
    max_states: int,
    grid_s: float,
) -> tuple[tuple[int, ...] | None, bool]:
    """Some assignment's counts whose bound is <= t, or None; and whether the front was capped."""
    front: list[_State] = [((0.0,) * k, (0,) * k)]
    capped = False
    for i in range(len(arr) - 1, -1, -1):
        room = t - arr[i]
        nxt: dict[tuple[int, ...], _State] = {}
        for work, counts in front:
            for w in range(k):
                lat, cost = costs[i][w]
                new = work[w] + cost
                if lat > room or new > room:
                    continue
                works = work[:w] + (new,) + work[w + 1 :]
                key = tuple(int(x / grid_s) for x in works)
                if key not in nxt or sum(works) < sum(nxt[key][0]):
                    nxt[key] = (works, counts[:w] + (counts[w] + 1,) + counts[w + 1 :])
        if not nxt:
            return None, capped
        front = _pareto(list(nxt.values()))
        if len(front) > max_states:
            front.sort(key=lambda s: max(s[0]))
            front, capped = front[:max_states], True
    return front[0][1], capped


def _pareto(states: list[_State]) -> list[_State]:
    """States no other state beats on every worker's work."""
    states.sort(key=lambda s: s[0])
    if len(states[0][0]) == 2:  # a staircase: keep strictly falling second coordinates
        out, best = [], float("inf")
        for s in states:
            if s[0][1] < best:
                out.append(s)
                best = s[0][1]
        return out
    if len(states) > 400:  # the general check is quadratic: leave it to the cap
        return states
    out = []
    for s in states:
        if not any(all(o <= x for o, x in zip(q[0], s[0], strict=True)) for q in out):
            out.append(s)
    return out
