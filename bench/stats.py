"""The harness's statistics: percentiles, mean ± sample std, the CV rule, per-run metrics.

All pure functions over plain records, so they are unit-tested on constructed data.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from typing import Any

from tandem.bench.driver import RequestRecord

# The figures the CV rule watches: if any varies by more than CV_LIMIT over the
# runs of a case, EXTRA_RUNS more runs are added (once; runs are never dropped).
HEADLINE = ("makespan_s", "output_tok_s")
CV_LIMIT = 0.05
EXTRA_RUNS = 2


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear between closest ranks (numpy's default)."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError("q must be in [0, 100]")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def distribution(values: Sequence[float]) -> dict[str, float | int | None]:
    """n, mean, median, p95, p99 and max (None when there are no values)."""
    if not values:
        return {"n": 0, "mean": None, "p50": None, "p95": None, "p99": None, "max": None}
    return {
        "n": len(values),
        "mean": statistics.fmean(values),
        "p50": percentile(values, 50),
        "p95": percentile(values, 95),
        "p99": percentile(values, 99),
        "max": max(values),
    }


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    if not values:
        raise ValueError("mean of no values")
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return statistics.fmean(values), std


def cv(values: Sequence[float]) -> float:
    """Coefficient of variation: sample std / mean (0 for one value or a zero mean)."""
    mean, std = mean_std(values)
    return std / abs(mean) if mean else 0.0


def needs_more_runs(runs: Sequence[dict[str, Any]], keys: Iterable[str] = HEADLINE) -> bool:
    """True when a headline figure's CV over ``runs`` (their ``metrics``) exceeds CV_LIMIT."""
    for key in keys:
        xs = [r["metrics"][key] for r in runs if r["metrics"].get(key) is not None]
        if len(xs) > 1 and cv(xs) > CV_LIMIT:
            return True
    return False


def run_metrics(
    records: Sequence[RequestRecord], worker_ids: Sequence[str], ttft_slo_s: float | None = None
) -> dict[str, Any]:
    """Everything measured in one run, from the client-side records. With ``ttft_slo_s``
    also goodput: the requests that completed with their first token within the SLO
    (as a fraction of all requests, and per second of makespan)."""
    ok = [r for r in records if r.error is None and r.token_s]
    t_first = min((r.submit_s for r in records), default=0.0)
    t_last = max((r.token_s[-1] for r in ok), default=t_first)
    makespan = t_last - t_first
    out_tokens = sum(r.output_tokens for r in ok)
    per_worker = {w: {"requests": 0, "output_tokens": 0} for w in worker_ids}
    for r in ok:
        row = per_worker.setdefault(r.worker or "?", {"requests": 0, "output_tokens": 0})
        row["requests"] += 1
        row["output_tokens"] += r.output_tokens
    good = {}
    if ttft_slo_s is not None:
        n_good = sum(1 for r in ok if r.token_s[0] - r.submit_s <= ttft_slo_s)
        good = {
            "goodput_fraction": n_good / len(records) if records else None,
            "goodput_rps": n_good / makespan if makespan > 0 else None,
        }
    return good | {
        "requests": len(records),
        "completed": len(ok),
        "errors": len(records) - len(ok),
        "makespan_s": makespan,
        "output_tokens": out_tokens,
        "output_tok_s": out_tokens / makespan if makespan > 0 else None,
        "queue_s": distribution([r.stats["queue_s"] for r in ok if "queue_s" in r.stats]),
        "ttft_s": distribution([r.token_s[0] - r.submit_s for r in ok]),
        "e2e_s": distribution([r.token_s[-1] - r.submit_s for r in ok]),
        "itl_s": distribution(list(itl_values(ok))),
        "per_worker": per_worker,
    }


def itl_values(records: Iterable[RequestRecord]) -> Iterable[float]:
    """Every gap between consecutive tokens of the same request."""
    for r in records:
        yield from (b - a for a, b in zip(r.token_s, r.token_s[1:], strict=False))


def summarize_runs(runs: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Mean, sample std and CV over runs of every scalar metric and distribution median/p95/p99."""
    series: dict[str, list[float]] = {}
    for run in runs:
        for key, value in _flat(run["metrics"]).items():
            series.setdefault(key, []).append(value)
    for key, suffix in (("oracle", ""), ("oracle_served", "_served")):
        if runs and all(r.get(key) for r in runs):
            series[f"oracle{suffix}_makespan_s"] = [r[key]["makespan_s"] for r in runs]
            series[f"vs_oracle{suffix}"] = [
                r["metrics"]["makespan_s"] / r[key]["makespan_s"] for r in runs
            ]
    if runs and all(r.get("twin_oracle") for r in runs):
        twin = [(r["metrics"]["makespan_s"], r["twin_oracle"]) for r in runs]
        series["vs_twin_oracle"] = [m / t["makespan_s"] for m, t in twin]
        series["twin_placement_loss"] = [t["own_makespan_s"] / t["makespan_s"] for _, t in twin]
        series["twin_model_gap"] = [m / t["own_makespan_s"] for m, t in twin]
        if all("policy_makespan_s" in t for _, t in twin):
            # placement loss = pricing loss (own / the policy priced right) x
            # objective loss (the policy priced right / the best placement)
            series["twin_pricing_loss"] = [
                t["own_makespan_s"] / t["policy_makespan_s"] for _, t in twin
            ]
            series["twin_objective_loss"] = [
                t["policy_makespan_s"] / t["makespan_s"] for _, t in twin
            ]
    out = {}
    for key, xs in series.items():
        mean, std = mean_std(xs)
        out[key] = {"mean": mean, "std": std, "cv": cv(xs), "n": len(xs)}
    return out


def _flat(metrics: dict[str, Any]) -> dict[str, float]:
    """Scalars and distribution statistics as ``name`` / ``name.p50`` keys."""
    flat: dict[str, float] = {}
    for key, value in metrics.items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            flat[key] = float(value)
        elif isinstance(value, dict) and "p50" in value:
            for stat in ("mean", "p50", "p95", "p99"):
                if value.get(stat) is not None:
                    flat[f"{key}.{stat}"] = float(value[stat])
        elif key == "per_worker":
            for w, row in value.items():
                flat[f"requests.{w}"] = float(row["requests"])
                flat[f"tokens.{w}"] = float(row["output_tokens"])
    return flat
