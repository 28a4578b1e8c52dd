"""Per-request and per-decision records as compact JSON (times relative to the run's start).

Per-token arrival times are summarized per request (count, first, last,
inter-token percentiles) unless ``keep_tokens``: a 48-request run at 128 tokens
would otherwise put ~6,000 floats per run in the result file.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tandem.bench.driver import RequestRecord
from tandem.bench.stats import percentile

_STAT_KEYS = ("prompt_tokens", "cached_tokens", "queue_s", "prefill_s", "decode_s", "ttft_s")


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 5)


def record_json(rec: RequestRecord, t0: float, keep_tokens: bool) -> dict[str, Any]:
    """One request: client times (s from the run's first submit), worker, stats."""
    gaps = [b - a for a, b in zip(rec.token_s, rec.token_s[1:], strict=False)]
    doc: dict[str, Any] = {
        "index": rec.index,
        "request_id": rec.request_id,
        "hit": rec.hit,
        "scheduled_s": _r(rec.scheduled_s - t0),
        "submit_s": _r(rec.submit_s - t0),
        "first_token_s": _r(rec.token_s[0] - t0) if rec.token_s else None,
        "last_token_s": _r(rec.token_s[-1] - t0) if rec.token_s else None,
        "done_s": _r(rec.done_s - t0) if rec.done_s is not None else None,
        "worker": rec.worker,
        "finish_reason": rec.finish_reason,
        "output_tokens": rec.output_tokens,
        "error": rec.error,
        "stats": {k: rec.stats[k] for k in _STAT_KEYS if k in rec.stats},
        "itl_s": {
            "p50": _r(percentile(gaps, 50)) if gaps else None,
            "p95": _r(percentile(gaps, 95)) if gaps else None,
            "p99": _r(percentile(gaps, 99)) if gaps else None,
            "max": _r(max(gaps)) if gaps else None,
        },
    }
    if keep_tokens:
        doc["token_s"] = [_r(t - t0) for t in rec.token_s]
    return doc


def decisions_json(records: Iterable[dict[str, Any]], request_ids: set[str]) -> list[dict]:
    """The workload's routing decisions (seeds and calibration left out), compacted:
    per candidate [id, active, queued, cached tokens, score]; ``calibrated`` and
    ``decode_ratio`` when the router ran with those options."""
    mine = [d for d in records if d.get("request") in request_ids]
    t0 = min((float(d.get("time", 0.0)) for d in mine), default=0.0)
    out = []
    for d in mine:
        out.append(
            {
                "request": d["request"],
                "time_s": _r(float(d.get("time", t0)) - t0),  # from the first decision
                "choice": d.get("choice"),
                "candidates": [
                    [c.get("id"), c.get("active"), c.get("queued"), c.get("cached_tokens")]
                    + [_r(c.get("score"))]
                    for c in d.get("candidates", [])
                ],
            }
            | {k: d[k] for k in ("calibrated", "decode_ratio") if k in d}  # router options
        )
    return out
