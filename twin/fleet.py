"""The router's decisions against exhaustive scoring, in the twin, at 2-128 workers.

Each case replays one workload on a fleet of half CPU, half GPU sim workers twice:
with the default policy as the router runs it (finish_time's memos, branch and
bound and C passes under lookahead), and with ``finish_time`` replaced by the
exhaustive reference (every candidate's finish predicted from scratch, then
``tie_break``). Mean E2E and TTFT side by side; identical choices give identical
numbers (the twin is deterministic).

    python -m tandem.twin.fleet [--trace FILE.jsonl] [SIZES...]

(the trace cases take a request trace in bench/trace.py's format, e.g. the
Mooncake synthetic trace; without one, only the bursts run).
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tandem.bench.trace import TraceScale
from tandem.bench.workload import PromptBook, Workload
from tandem.broker.policies import Decision, RouteRequest, WorkerView, finish, tie_break
from tandem.twin.replay import TwinWorkerSpec, replay
from tandem.workers.device_model import SimProfile


def _encode(text: str) -> list[int]:
    return [1000 + ord(c) % 500 for c in text]  # one id per character: the twin needs ids


def exhaustive_choose(self: Any, req: RouteRequest, workers: list[WorkerView]) -> Decision:
    """Every candidate's predicted finish, from scratch; the least, by ``tie_break``."""
    scores = {w.id: finish.predict_finish_s(req, w) for w in workers}
    return tie_break(workers, scores)


@contextmanager
def exhaustive() -> Iterator[None]:
    saved = finish.FinishTime.choose
    finish.FinishTime.choose = exhaustive_choose  # type: ignore[method-assign]
    try:
        yield
    finally:
        finish.FinishTime.choose = saved  # type: ignore[method-assign]


def fleet(n: int) -> list[TwinWorkerSpec]:
    cpu, gpu = SimProfile.load("h200-cpu"), SimProfile.load("h200-gpu")
    return [TwinWorkerSpec(f"w{i}", gpu if i % 2 else cpu, 8 if i % 2 else 4) for i in range(n)]


def workloads(n: int, trace: Path | None) -> dict[str, Workload]:
    out = {"burst": Workload(kind="burst", requests=6 * n, spacing_s=0.01, hit_fraction=0.5)}
    if trace is not None:  # the trace's first requests, arriving n/4 times as fast
        scale = TraceScale(time_scale=max(1.0, n / 4), limit=min(1000, 25 * n))
        out["trace"] = Workload(kind="trace", trace=str(trace), trace_scale=scale)
    return out


def means(n: int, wl: Workload) -> dict[str, float]:
    rep = replay(fleet(n), "lookahead", wl.arrivals(0), PromptBook(_encode, wl))
    done = [r for r in rep.records if r.token_s]
    return {
        "e2e_s": statistics.fmean(r.token_s[-1] - r.submit_s for r in done),
        "ttft_s": statistics.fmean(r.token_s[0] - r.submit_s for r in done),
        "requests": len(done),
    }


def compare(sizes: list[int], trace: Path | None = None) -> list[dict[str, Any]]:
    rows = []
    for n in sizes:
        for name, wl in workloads(n, trace).items():
            fast = means(n, wl)
            with exhaustive():
                slow = means(n, wl)
            rows.append({"workers": n, "workload": name, "fast": fast, "exhaustive": slow})
    return rows


def main(argv: list[str]) -> None:
    trace = None
    if argv[:1] == ["--trace"]:
        trace, argv = Path(argv[1]), argv[2:]
    for row in compare([int(x) for x in argv] or [2, 8, 32, 128], trace):
        f, e = row["fast"], row["exhaustive"]
        print(f"| {row['workers']} | {row['workload']} | {f['requests']} | "
              f"{f['e2e_s']:.3f} | {e['e2e_s']:.3f} | {f['ttft_s']:.3f} | {e['ttft_s']:.3f} |",
              flush=True)  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1:])
