"""Plain-text tables for the CLI (no terminal library needed for a few columns)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tandem.common import protocol as p


def render(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v)


def workers_table(reply: p.StatusReply) -> str:
    head = f"policy {reply.policy}, {reply.requests_in_flight} request(s) in flight"
    if reply.requests_pending:
        head += f", {reply.requests_pending} waiting for a worker"
    if not reply.workers:
        return head + "\n(no workers connected)"
    calibrated = any("calibrated_decode_tok_s" in w for w in reply.workers)
    rows = [
        [
            w["id"],
            w["backend"],
            w["device"],
            f"{w['active']}/{w['max_active']}",
            w["queued"],
            f"{w['kv_used_tokens']}/{w['kv_capacity_tokens']}",
            w["cached_blocks"],
            w["prefill_tok_s"],
            ",".join(f"{x:.0f}" for x in w["decode_tok_s"]),
            w["routed_total"],
            w["last_seen_s"],
        ]
        + (_calibrated(w) if calibrated else [])
        for w in reply.workers
    ]
    headers = [
        "worker",
        "backend",
        "device",
        "active",
        "queued",
        "kv",
        "blocks",
        "prefill/s",
        "decode/s by batch",
        "routed",
        "seen_s_ago",
    ]
    if calibrated:  # what the router prices with now, after what requests took
        headers += ["prefill/s now", "decode/s now"]
    return head + "\n" + render(headers, rows)


def _calibrated(w: dict[str, Any]) -> list[Any]:
    decode = w.get("calibrated_decode_tok_s")
    return [w.get("calibrated_prefill_tok_s", ""), ",".join(f"{x:.0f}" for x in decode or [])]
