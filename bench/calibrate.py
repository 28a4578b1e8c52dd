"""Measure each worker's rates through the running cluster, for the oracle bound.

Measured, not advertised: a worker's Ready carries a stored profile or a rough
default, and what the bench must bound is what the workers deliver through the
router. Per worker, with the caches seeded:

- prefill tok/s: the seed itself (a cold ``prefix_tokens`` prefill, the
  worker's ``prefill_s``);
- decode tok/s of one request alone: one pinned request, (n-1) tokens over
  first-to-last token time at the client;
- peak aggregate decode tok/s: ``max_active`` identical pinned requests sent
  together, all their (n-1) tokens over the span from the earliest first token
  to the latest last token.

Workers are measured one after the other so they do not compete for the CPU.

Served: what the router priced each worker with when a run ended (``served_rates``):
its live step-time model of the steps the worker ran while serving, the warm-up's
or the profile's rates only where serving never ran a batch size. Cheap (one
status call per run) and honest about serving's own overheads, which a warm-up
or an isolated calibration request does not pay.

A worker handed at most N requests never decodes more than N rows at once, so an
oracle over N requests takes its peak at batch ``min(N, max_active)`` where the
rates say it by batch size (``to_worker_rates(..., jobs=N)``): the aggregate decode
rate is non-decreasing in batch size (``common.ratefit``), so this keeps a bound.
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Mapping
from typing import Any

from tandem.bench.driver import RequestRecord, pinned_batch
from tandem.bench.oracle import WorkerRates


def decode_rate(records: list[RequestRecord]) -> float:
    """Aggregate decode tok/s of requests that ran together (first tokens excluded)."""
    ok = [r for r in records if r.error is None and len(r.token_s) > 1]
    if not ok:
        raise RuntimeError(f"calibration requests failed: {[r.error for r in records]}")
    tokens = sum(len(r.token_s) - 1 for r in ok)
    span = max(r.token_s[-1] for r in ok) - min(r.token_s[0] for r in ok)
    return tokens / span if span > 0 else float("inf")


def measure_rates(
    address: str,
    seeds: dict[str, dict[str, Any]],
    prompt: list[int],
    max_active: dict[str, int],
    output_tokens: int,
    timeout_s: float,
) -> dict[str, dict[str, Any]]:
    """Rates of every seeded worker (see the module docstring), as JSON-able dicts."""
    out = {}
    n_out = max(2, output_tokens)  # a rate needs at least two tokens
    for worker, st in seeds.items():
        one = asyncio.run(pinned_batch(address, worker, prompt, 1, n_out, timeout_s))
        full = asyncio.run(
            pinned_batch(address, worker, prompt, max_active[worker], n_out, timeout_s)
        )
        prefill_s = float(st.get("prefill_s") or 0.0)
        out[worker] = {
            "prefill_tok_s": st["prompt_tokens"] / prefill_s if prefill_s > 0 else float("inf"),
            "decode_tok_s_1": decode_rate(one),
            "decode_tok_s_peak": max(decode_rate(full), decode_rate(one)),
            "source": "measured",
        }
    return out


def advertised_rates(status_rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Rates the workers advertised in Ready (the router's own model), from a status reply."""
    return {
        row["id"]: _by_batch(row["prefill_tok_s"], row["decode_tok_s"], "advertised")
        for row in status_rows
    }


def served_rates(status_rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Rates the router priced each worker with (live steps first), from a status reply."""
    out = {}
    for row in status_rows:
        rates = _by_batch(row["priced_prefill_tok_s"], row["priced_decode_tok_s"], "served")
        rates["live_decode_tok_s"] = row.get("live_decode_tok_s")
        rates["live_decode_samples"] = row.get("live_decode_samples")
        out[row["id"]] = rates
    return out


def _by_batch(prefill: float, decode: list[float], source: str) -> dict[str, Any]:
    return {
        "prefill_tok_s": float(prefill),
        "decode_tok_s_1": float(decode[0]),
        "decode_tok_s_peak": float(max(decode)),
        "decode_tok_s": [float(x) for x in decode],
        "source": source,
    }


def to_worker_rates(
    rates: dict[str, dict[str, Any]], jobs: int | None = None
) -> dict[str, WorkerRates]:
    """The oracle's rates; with ``jobs`` (the run's requests) the peak is taken at
    batch ``min(jobs, max_active)`` where the rates say it by batch (module docstring)."""
    out = {}
    for w, r in rates.items():
        peak = r["decode_tok_s_peak"]
        if jobs and r.get("decode_tok_s"):
            peak = max(r["decode_tok_s"][: max(1, jobs)])
        out[w] = WorkerRates(r["prefill_tok_s"], r["decode_tok_s_1"], peak)
    return out


def group_served(group: Mapping[str, Any], runs_of: str = "all") -> dict[str, dict[str, Any]]:
    """One device model for every policy of a bench group: per worker, the median
    over the group's runs of the served prefill rate and decode tok/s at each batch.

    ``runs_of``: "all" runs; "shared", those that sent requests to every worker;
    "alone", per worker those that sent requests to it alone (either falls back to
    all runs when there is none). A worker's served speed can depend on the
    placement — on the H200 the GPU decoded 0.6-0.8x as fast at batch 4 in runs it
    shared with a busy CPU worker as in forced:gpu runs — so split placements are
    priced by shared runs and one-worker placements by runs alone."""
    if runs_of not in ("all", "shared", "alone"):
        raise ValueError(f"runs_of {runs_of!r}: all, shared or alone")
    runs = [r for c in group["cases"] for r in c["runs"] if r.get("served_rates")]
    ids = {w for r in runs for w in r["served_rates"]}

    def used(run: Mapping[str, Any]) -> set[str]:
        return {x["worker"] for x in run.get("records", []) if x.get("worker")}

    out: dict[str, dict[str, Any]] = {}
    for wid in sorted(ids):
        pick = runs
        if runs_of == "shared":
            pick = [r for r in runs if used(r) >= ids] or runs
        elif runs_of == "alone":
            pick = [r for r in runs if used(r) == {wid}] or runs
        rates = [r["served_rates"][wid] for r in pick if wid in r["served_rates"]]
        width = min(len(x["decode_tok_s"]) for x in rates)
        out[wid] = {
            "prefill_tok_s": statistics.median(x["prefill_tok_s"] for x in rates),
            "decode_tok_s": [
                statistics.median(x["decode_tok_s"][b] for x in rates) for b in range(width)
            ],
        }
    return out
