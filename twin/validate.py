"""Check the twin against recorded bench results with sim workers, case by case.

For every group and policy of a bench result.json whose workers are all sim
workers, the twin replays the same workload (same arrivals: same seed and run
index), the same workers and the same router options (calibration on or off as
the recorded decisions say) and the comparison reports, per case, the mean
makespan of both and the mean number of requests each worker got.
"""

from __future__ import annotations

import statistics
from typing import Any

from tandem.bench.spec import parse_workers
from tandem.bench.workload import PromptBook, Workload
from tandem.twin.sim import twin_case, twin_spec

TOLERANCE = 0.03  # the twin's target: makespans and placements within 3 %


def _router_policy(case: dict[str, Any]) -> str:
    """The case's policy with the router options its recorded decisions show."""
    policy = case["router_policy"].split("+")[0]
    decisions = [d for run in case["runs"] for d in run.get("decisions", [])]
    calibrated = any(d.get("calibrated") for d in decisions)
    ratio = any(d.get("decode_ratio") not in (None, 1.0) for d in decisions)
    return policy + ("+calibrate" if calibrated else "+static") + ("+ratio" if ratio else "")


def _placement(runs: list[dict[str, Any]]) -> dict[str, float]:
    workers = {w for r in runs for w in r["metrics"]["per_worker"]}
    return {
        w: statistics.fmean(r["metrics"]["per_worker"].get(w, {}).get("requests", 0) for r in runs)
        for w in sorted(workers)
    }


def compare(doc: dict[str, Any], encode: Any, source: str = "") -> list[dict[str, Any]]:
    """One row per (group, policy): bench vs twin makespan and placement."""
    workers = parse_workers([w["spec"] for w in doc["config"]["workers"]])
    if any(w.backend != "sim" for w in workers):
        raise ValueError(f"{source}: only results with sim workers have a twin")
    rows = []
    for group in doc["groups"]:
        wl = Workload.from_json(group["workload"])
        specs = [twin_spec(w, group["max_active"]) for w in workers]
        book = PromptBook(encode, wl)
        for case in group["cases"]:
            policy = _router_policy(case)
            seed = doc["config"].get("seed", 0)
            twin_runs = [twin_case(specs, wl, book, policy, r["run"], seed) for r in case["runs"]]
            bench_mk = statistics.fmean(r["metrics"]["makespan_s"] for r in case["runs"])
            twin_mk = statistics.fmean(r["metrics"]["makespan_s"] for r in twin_runs)
            bp, tp = _placement(case["runs"]), _placement(twin_runs)
            n = max(1, group["cases"][0]["runs"][0]["metrics"]["requests"])
            moved = max(abs(bp.get(w, 0.0) - tp.get(w, 0.0)) for w in bp.keys() | tp.keys())
            rows.append(
                {
                    "source": source,
                    "group": group["label"],
                    "policy": policy,
                    "runs": len(case["runs"]),
                    "bench_makespan_s": bench_mk,
                    "twin_makespan_s": twin_mk,
                    "makespan_diff": twin_mk / bench_mk - 1,
                    "bench_placement": bp,
                    "twin_placement": tp,
                    "placement_diff": moved / n,  # requests moved, as a share of the run's
                    "twin_wall_s": sum(r["twin"]["wall_s"] for r in twin_runs),
                }
            )
    return rows


def render(rows: list[dict[str, Any]]) -> str:
    """A markdown table of ``compare`` rows, and how many hold the tolerance."""
    lines = [
        "| result | group | policy | runs | bench makespan s | twin makespan s | diff | "
        "bench placement | twin placement | placement diff | twin wall s |",
        "|" + " --- |" * 11,
    ]
    for r in rows:
        fmt = lambda pl: ", ".join(f"{w} {n:.1f}" for w, n in pl.items() if n)  # noqa: E731
        lines.append(
            f"| {r['source']} | {r['group']} | {r['policy']} | {r['runs']} | "
            f"{r['bench_makespan_s']:.3f} | {r['twin_makespan_s']:.3f} | "
            f"{100 * r['makespan_diff']:+.1f} % | {fmt(r['bench_placement'])} | "
            f"{fmt(r['twin_placement'])} | {100 * r['placement_diff']:.1f} % | "
            f"{r['twin_wall_s']:.2f} |"
        )
    ok = sum(
        abs(r["makespan_diff"]) <= TOLERANCE and r["placement_diff"] <= TOLERANCE for r in rows
    )
    lines += ["", f"{ok} of {len(rows)} cases within {100 * TOLERANCE:.0f} % on both."]
    return "\n".join(lines) + "\n"
