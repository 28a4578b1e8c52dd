"""Policies compared round by round over bench result files.

usage: paired.py DEFAULT RESULT.json...

Per policy: makespan mean +- 95 % CI (t over runs), mean TTFT, goodput. Then the
default against each other policy: round n of a file (the n-th run of each policy,
interleaved by the bench) paired, the geometric mean of the per-round makespan
ratios default / other with its 95 % CI (t over the log ratios), and the rounds
the default was faster.
"""

import json
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
        2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086]  # fmt: skip


def t975(df: int) -> float:
    return T975[min(df, len(T975)) - 1]


def load(paths: list[str]) -> dict[str, list[tuple[str, int, float, float, float]]]:
    """policy -> (file, run, makespan s, TTFT mean s, goodput fraction) per run."""
    runs = defaultdict(list)
    for path in paths:
        doc = json.loads(Path(path).read_text())
        for group in doc["groups"]:
            for case in group["cases"]:
                for run in case["runs"]:
                    m = run["metrics"]
                    row = (path, run["run"], m["makespan_s"], m["ttft_s"]["mean"],
                           m["goodput_fraction"])  # fmt: skip
                    runs[case["policy"]].append(row)
    return runs


def main(default: str, paths: list[str]) -> None:
    runs = load(paths)
    for policy, rows in runs.items():
        makespans = [r[2] for r in rows]
        n = len(makespans)
        half = t975(n - 1) * statistics.stdev(makespans) / math.sqrt(n) if n > 1 else 0.0
        ttft = statistics.mean(r[3] for r in rows)
        goodput = 100 * statistics.mean(r[4] for r in rows)
        print(f"{policy:12s} n={n:2d} makespan {statistics.mean(makespans):6.2f} +- {half:.2f}"
              f"  TTFT mean {ttft:.2f}  goodput {goodput:.1f} %")  # fmt: skip
    base = {(r[0], r[1]): r[2] for r in runs[default]}
    for policy, rows in runs.items():
        logs = [math.log(base[r[0], r[1]] / r[2]) for r in rows if (r[0], r[1]) in base]
        if policy == default or len(logs) < 2:
            continue
        n, mean = len(logs), statistics.mean(logs)
        half = t975(n - 1) * statistics.stdev(logs) / math.sqrt(n)
        won = sum(x < 0 for x in logs)
        print(f"{default} / {policy}: {math.exp(mean):.3f} "
              f"[{math.exp(mean - half):.3f}, {math.exp(mean + half):.3f}], "
              f"{default} faster in {won} of {n}")  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
