"""The bench's decision timing alone (bench/router_state.py), more repeats, and where
the time goes: usage decisions.py N [REPEATS] [parts]. Prints the median of
REPEATS timed decisions at N workers in microseconds; with "parts", also the
median of each step (pool refresh, offered views, finish_time's answers and
choice, lookahead, the assignment) timed around its call."""

import random
import statistics
import sys
import time

from tandem.bench.router_state import loaded_router, time_decision


def main() -> None:
    n = int(sys.argv[1])
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 600
    router = loaded_router(n, random.Random(n))
    acc: dict[str, list[float]] = {}

    def timed(obj: object, name: str, label: str) -> None:
        if not hasattr(obj, name):
            return
        fn = getattr(obj, name)

        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            acc.setdefault(label, []).append(time.perf_counter() - t0)
            return out

        setattr(obj, name, wrapper)

    if "parts" in sys.argv[3:]:
        timed(router.views._pool, "refresh", "refresh")
        timed(router.views, "offered", "offered")
        timed(router.views, "candidates", "candidates")
        timed(router.policy.base, "_answers", "answers")
        timed(router.policy.base, "choose", "finish_time")
        timed(router.policy, "choose", "lookahead")
        timed(router, "_assign", "assign")
    for i in range(20):
        time_decision(router, i)
    acc.clear()
    times = [time_decision(router, i) for i in range(repeats)]
    parts = {k: round(statistics.median(v) * 1e6) for k, v in acc.items()}
    print(round(statistics.median(times) * 1e6), parts if parts else "")


if __name__ == "__main__":
    main()
