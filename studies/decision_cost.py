"""What one routing decision costs the router, per policy and fleet size.

``python -m studies.decision_cost [N ...]`` times ``policy.choose`` on N
busy workers (each at ``max_active`` 8, half its rows decoding and half still
prefilling, 4 more queued: 12 requests a worker) in two patterns:

- ``cold``: every view new (a router whose every worker changed since the
  last decision, e.g. after a round of heartbeats);
- ``burst``: one view changed since the previous decision (the chosen
  worker's ledger grew), which is what a burst of arrivals looks like;
- ``mixed``: cold again, over a fleet of two kinds of device with unequal
  loads and prefix hits (``mixed_views``): the busy fleet above is N equal
  workers, whose equal scores tie and so cannot be pruned by finish_time's
  branch and bound; a real fleet differs from worker to worker.

Each figure is the median over ``repeats`` timed decisions (and the minimum),
in milliseconds of the thread's CPU time (``time.thread_time``): on a shared
machine wall time also counts the waits for a free core, which are not the
decision's cost. Wall-time medians are printed beside them.
"""

from __future__ import annotations

import random
import statistics
import sys
import time

from tandem.broker.policies import Load, RouteRequest, WorkerView, parse_policy

REQ = RouteRequest(516, 128)


def busy_views(n: int, tag: int = 0) -> list[WorkerView]:
    """``n`` busy workers (see the module docstring); ``tag`` makes the views distinct."""
    rates = tuple(b / (0.0034 * (1 + 0.1 * (b - 1))) for b in range(1, 9))
    return [
        WorkerView(
            f"w{i}",
            2551.0,
            rates,
            8,
            cached_tokens=512,
            active=tuple(Load(0 if j % 2 else 4, 60 + 5 * j + tag) for j in range(8)),
            queued=(Load(4, 128),) * 4,
        )
        for i in range(n)
    ]


def mixed_views(n: int, rng: random.Random) -> list[WorkerView]:
    """``n`` workers, a third fast (the busy fleet's) and two thirds slow (max_active
    4), each with a random number of active rows (a full one may queue more) and,
    one in three, the prompt's prefix cached."""
    fast = tuple(b / (0.0034 * (1 + 0.1 * (b - 1))) for b in range(1, 9))
    slow = tuple(b / (0.02 * (1 + 0.3 * (b - 1))) for b in range(1, 5))
    out = []
    for i in range(n):
        rates, prefill = (fast, 2551.0) if i % 3 == 0 else (slow, 200.0)
        n_active = rng.randint(0, len(rates))
        n_queued = rng.choice([0, 0, 1, 4]) if n_active == len(rates) else 0
        active = tuple(
            Load(rng.choice([0, 0, 40, 300]), rng.randint(1, 200)) for _ in range(n_active)
        )
        queued = tuple(Load(rng.choice([40, 500]), 128) for _ in range(n_queued))
        cached = rng.choice([0, 0, 512])
        out.append(WorkerView(f"w{i}", prefill, rates, len(rates), cached_tokens=cached,
                              active=active, queued=queued))  # fmt: skip
    return out


def time_policy(policy: str, n: int, repeats: int) -> dict[str, float]:
    """Median and minimum ms per decision: cold, burst and mixed (cold)."""
    pol = parse_policy(policy)
    cold, burst, wall, mixed = [], [], [], []
    rng = random.Random(n)
    for k in range(repeats):
        views = mixed_views(n, rng)
        t = time.thread_time()
        pol.choose(REQ, views)
        mixed.append(time.thread_time() - t)
        views = busy_views(n, tag=k + 1)
        t, w = time.thread_time(), time.perf_counter()
        pol.choose(REQ, views)
        cold.append(time.thread_time() - t)
        wall.append(time.perf_counter() - w)
        i = k % n  # the worker the previous decision chose gets one more queued request
        views[i] = views[i].replace(queued=(*views[i].queued, Load(4, 128)))
        t = time.thread_time()
        pol.choose(REQ, views)
        burst.append(time.thread_time() - t)
    ms = 1000.0
    return {
        "cold_median_ms": statistics.median(cold) * ms,
        "cold_min_ms": min(cold) * ms,
        "burst_median_ms": statistics.median(burst) * ms,
        "burst_min_ms": min(burst) * ms,
        "cold_wall_median_ms": statistics.median(wall) * ms,
        "mixed_median_ms": statistics.median(mixed) * ms,
    }


def main(argv: list[str]) -> None:
    sizes = [int(x) for x in argv] or [16, 256]
    print(
        "| policy | workers | cold median ms | cold min ms | burst median ms | burst min ms "
        "| cold wall median ms | mixed median ms |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for n in sizes:
        for policy in ("phase_cost", "finish_time", "lookahead", "least_loaded"):
            r = time_policy(policy, n, repeats=max(5, 2000 // n))
            print(
                f"| {policy} | {n} | {r['cold_median_ms']:.3f} | {r['cold_min_ms']:.3f} | "
                f"{r['burst_median_ms']:.3f} | {r['burst_min_ms']:.3f} | "
                f"{r['cold_wall_median_ms']:.3f} | {r['mixed_median_ms']:.3f} |"
            )


if __name__ == "__main__":
    main(sys.argv[1:])
