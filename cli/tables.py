"""Plain-text tables for the CLI (no terminal library needed for a few columns)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tandem.client.waiting import stage_words
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
    starting = ["", starting_table(reply.starting)] if reply.starting else []
    if not reply.workers:
        return "\n".join([head, *starting] if starting else [head, "(no workers connected)"])
    rows = [
        [
            worker_label(w),
            w.get("node") or "-",  # a router of before version 12 names none
            w["backend"],
            w["device"],
            f"{w['active']}/{w['max_active']}",
            w["queued"],
            f"{w['kv_used_tokens']}/{w['kv_capacity_tokens']}",
            w["cached_blocks"],
            cache_cell(w),
            w["prefill_tok_s"],
            _or_dash(w.get("live_prefill_tok_s")),
            w.get("priced_prefill_tok_s", w["prefill_tok_s"]),
            w["routed_total"],
            w["last_seen_s"],
            capabilities_cell(w),
        ]
        for w in reply.workers
    ]
    headers = ["worker", "node", "backend", "device", "active", "queued", "kv", "blocks",
               "cache device +host", "prefill/s profile", "live", "priced", "routed",
               "seen_s_ago", "caps"]  # fmt: skip
    notes = [
        f"* {w['id']}: {PROVISIONAL}; {w.get('live_steps', 0)} served decode steps so far"
        for w in reply.workers
        if w.get("provisional")
    ]
    notes += [
        f"! {w['id']}: repriced: {w['served']['repriced']}"
        for w in reply.workers
        if (w.get("served") or {}).get("repriced")
    ]
    notes.append(CAPABILITIES_LEGEND)
    tables = [head, render(headers, rows), *notes, *starting]
    return "\n".join([*tables, "", rates_table(reply.workers)])


def starting_table(rows: list[dict[str, Any]]) -> str:
    """The workers announced but not registered yet (``StatusReply.starting``)."""
    cells = [[w["id"], w["state"], w["device"], stage_words(w["stage"]), _or_dash(w.get("eta_s")),
              w["starting_for_s"]] for w in rows]  # fmt: skip
    return render(["worker", "state", "device", "stage", "eta_s", "starting_for_s"], cells)


PROVISIONAL = "provisional: priced on start-up rates its served steps have not yet borne out"
# What a worker serves beyond plain sampling (Ready.capabilities), one letter each in
# a fixed place, so the column stays short: "PBMLJ-" serves all but json_schema_full.
CAPABILITY_LETTERS = {
    p.Capability.PENALTIES: "P",
    p.Capability.LOGIT_BIAS: "B",
    p.Capability.MIN_P: "M",
    p.Capability.LOGPROBS: "L",
    p.Capability.JSON_SCHEMA: "J",
    p.Capability.JSON_SCHEMA_FULL: "F",
}
CAPABILITIES_LEGEND = "caps: " + ", ".join(f"{x} {c}" for c, x in CAPABILITY_LETTERS.items())


def capabilities_cell(w: dict[str, Any]) -> str:
    """A status row's capabilities as CAPABILITY_LETTERS, "-" for each one it lacks."""
    has = set(w.get("capabilities") or ())
    return "".join(x if c in has else "-" for c, x in CAPABILITY_LETTERS.items())


def cache_cell(w: dict[str, Any]) -> str:
    """A worker's prefix cache by tier, tokens held / capacity: the device's, then the
    host-RAM tier's where it has one; "-" when the worker does not say."""
    cap = w.get("cache_capacity_tokens")
    if not cap:
        return "-"
    out = f"{_tokens(w.get('cache_tokens', 0))}/{_tokens(cap)}"
    host = w.get("host_cache_capacity_tokens")
    if host:
        out += f" +{_tokens(w.get('host_cache_tokens', 0))}/{_tokens(host)}"
    return out


def _tokens(n: int) -> str:
    return f"{n / 1e6:.1f}M" if n >= 1_000_000 else f"{n / 1e3:.0f}k" if n >= 10_000 else str(n)


def worker_label(w: dict[str, Any]) -> str:
    """A worker's id, starred while its prices are provisional (``PROVISIONAL``)."""
    return f"{w['id']}*" if w.get("provisional") else str(w["id"])


def rates_table(workers: list[dict[str, Any]]) -> str:
    """Aggregate decode tok/s by batch size: the stored profile, what the worker's
    steps measured (with how many steps), and what the router prices with."""
    # The widest list of any worker: a Ready may give fewer rates than max_active,
    # while the priced and live lists run to max_active.
    width = max(len(w.get(k) or []) for w in workers
                for k in ("decode_tok_s", "priced_decode_tok_s", "live_decode_tok_s"))  # fmt: skip
    rows: list[list[Any]] = []
    for w in workers:
        live = w.get("live_decode_tok_s") or []
        samples = w.get("live_decode_samples") or []
        repaired = set(w.get("profile_repaired") or [])
        profile = [f"{x:.0f}" + ("!" if b in repaired else "") for b, x in
                   enumerate(w["decode_tok_s"], 1)]  # fmt: skip
        measured = [
            "-" if x is None else f"{x:.0f} ({n})" for x, n in zip(live, samples, strict=False)
        ]
        priced = [f"{x:.0f}" for x in w.get("priced_decode_tok_s") or w["decode_tok_s"]]
        rows += [[w["id"], "profile", *profile], ["", "live (steps)", *measured],
                 ["", "priced", *priced]]  # fmt: skip
    rows = [r + [""] * (width + 2 - len(r)) for r in rows]
    headers = ["decode tok/s", "by batch", *(str(b) for b in range(1, width + 1))]
    notes = [
        f"{w['id']}: live steps quoted at {w['live_context_tokens']:.0f} tokens of context per"
        f" row; each context token adds {w['live_context_s'] * 1e6:.3g} us per row per step"
        for w in workers
        if w.get("live_context_s")
    ]
    if any(w.get("profile_repaired") for w in workers):
        notes.append("! = far off its neighbours: replaced in pricing (see docs/ROUTING.md)")
    return "\n".join([render(headers, rows), *notes])


def _or_dash(x: Any) -> Any:
    return "-" if x is None else x
