"""Makespan against mean TTFT over placements of one bench case, in the twin.

    python3 studies/gpu-box/frontier.py RESULT.json|TGZ LABEL [--slow cpu] [--fast lgpu]

A burst on a fast worker whose slots are all taken and a slow one that is free: each
request sent to the slow worker starts at once but ends later; each kept on the fast
one waits for a slot. For the case LABEL (a bench group) of a result, this replays
every run's arrivals in the twin (twin/replay.py, on the speeds the group served:
``bench.calibrate.group_served``) with the last k arrivals on ``--slow`` and the rest
on ``--fast``, for k = 0 .. the slow worker's max active, and with each of the
group's policies deciding; per placement the mean over runs of makespan and mean
TTFT. Where no k reaches the best TTFT without the makespan of a larger k, no
placement ties both.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from study import _encoder, load  # noqa: E402  (a script beside this one)


def measures(rep: Any) -> tuple[float, float]:
    """(makespan, mean TTFT) of one replay, seconds."""
    t0 = min(r.submit_s for r in rep.records)
    done = [r for r in rep.records if r.token_s]
    makespan = max(r.token_s[-1] for r in done) - t0
    return makespan, statistics.fmean(r.token_s[0] - r.submit_s for r in done)


def frontier(doc: dict[str, Any], label: str, slow: str, fast: str) -> list[str]:
    from tandem.bench.calibrate import group_served
    from tandem.bench.spec import parse_worker
    from tandem.bench.workload import PromptBook, Workload
    from tandem.twin import device as twin_device
    from tandem.twin.oracle import served_devices
    from tandem.twin.replay import replay

    group = next(g for g in doc["groups"] if g["label"] == label)
    twin_device.VOCAB_SIZE = max(twin_device.VOCAB_SIZE, 1 << 31)  # as study.py twin_rows
    wl = Workload.from_json(group["workload"])
    book = PromptBook(_encoder(doc, None), wl)
    active = {w["id"]: parse_worker(w["spec"], set()).max_active or group["max_active"]
              for w in doc["config"]["workers"]}  # fmt: skip
    specs = served_devices(group_served(group, "all"), active)
    runs = sorted({r["run"] for c in group["cases"] for r in c["runs"]})
    rows: dict[str, list[tuple[float, float]]] = {}
    for run in runs:
        arrivals = wl.arrivals(doc["config"]["seed"] + run)
        n = len(arrivals)
        for k in range(active[slow] + 1):
            for name, lo, hi in (("first", 0, k), ("last", n - k, n)):
                pins = {a.index: slow if lo <= i < hi else fast for i, a in enumerate(arrivals)}
                rep = replay(specs, "least_loaded", arrivals, book,
                             seed_prefix=wl.seeds_prefix, placement=pins)  # fmt: skip
                rows.setdefault(f"{name} {k} on {slow}", []).append(measures(rep))
        for case in group["cases"]:
            policy = case["router_policy"]
            rep = replay(specs, policy, arrivals, book, seed_prefix=wl.seeds_prefix)
            rows.setdefault(f"policy {policy}", []).append(measures(rep))
    out = [f"{label}: the twin on the served speeds, mean over {len(runs)} runs' arrivals", "",
           "| placement | makespan s | mean TTFT s |", "| --- | --- | --- |"]  # fmt: skip
    for name, xs in rows.items():
        mk = statistics.fmean(x[0] for x in xs)
        ttft = statistics.fmean(x[1] for x in xs)
        out.append(f"| {name} | {mk:.3f} | {ttft:.3f} |")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("path")
    ap.add_argument("label")
    ap.add_argument("--slow", default="cpu")
    ap.add_argument("--fast", default="lgpu")
    a = ap.parse_args(argv)
    for _, doc in load([a.path]):
        if any(g["label"] == a.label for g in doc["groups"]):
            print("\n".join(frontier(doc, a.label, a.slow, a.fast)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
