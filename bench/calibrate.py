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
"""

from __future__ import annotations

import asyncio
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
        row["id"]: {
            "prefill_tok_s": float(row["prefill_tok_s"]),
            "decode_tok_s_1": float(row["decode_tok_s"][0]),
            "decode_tok_s_peak": float(max(row["decode_tok_s"])),
            "source": "advertised",
        }
        for row in status_rows
    }


def to_worker_rates(rates: dict[str, dict[str, Any]]) -> dict[str, WorkerRates]:
    return {
        w: WorkerRates(r["prefill_tok_s"], r["decode_tok_s_1"], r["decode_tok_s_peak"])
        for w, r in rates.items()
    }
