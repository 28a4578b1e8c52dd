"""The Markdown tables of a ``studies/peer.py`` run: ratios of each tandem config to
each peer config per repetition (same repetition, same prompts), their median and range, and the
absolute medians behind them.

    .venv/bin/python studies/peer_report.py peer.json > docs/results/peer-tables.md
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict

METRICS = {  # key: (label, unit scale, unit)
    "out_tok_s": ("output tok/s", 1.0, ""),
    "ttft_p50": ("TTFT p50", 1.0, " s"),
    "itl_p50": ("ITL p50", 1000.0, " ms"),
    "itl_p99": ("ITL p99", 1000.0, " ms"),
    "gap_p99": ("chunk gap p99", 1000.0, " ms"),
    "gap_max": ("worst chunk gap", 1000.0, " ms"),
    "e2e_p50": ("E2E p50", 1.0, " s"),
}


def tables(record: dict) -> str:
    runs = record["runs"]
    by = defaultdict(dict)  # (config, rep) -> results
    for r in runs:
        by[(r["config"], r["rep"])] = r["results"]
    configs = list(dict.fromkeys(r["config"] for r in runs))
    peers = [c for c in configs if c.startswith("peer")]
    workloads = [w for w, v in runs[0]["results"].items() if "out_tok_s" in v]
    reps = sorted({r["rep"] for r in runs})
    out = []
    pairs_of = [(cfg, peer) for cfg in configs if not cfg.startswith("peer") for peer in peers]
    for cfg, peer in pairs_of:
        out.append(f"\n**{cfg} ÷ {peer}** (median [min-max] over {len(reps)} repetitions)\n")
        out.append("| metric | " + " | ".join(workloads) + " |")
        out.append("|---" * (len(workloads) + 1) + "|")
        for key, (label, _, _) in METRICS.items():
            cells = []
            for wl in workloads:
                both = [k for k in reps if (cfg, k) in by and (peer, k) in by]
                pairs = [(by[(cfg, k)], by[(peer, k)]) for k in both]
                ratios = [t[wl][key] / q[wl][key] for t, q in pairs if q[wl][key]]
                cells.append(_spread(ratios))
            out.append(f"| {label} | " + " | ".join(cells) + " |")
    out.append("\n**Absolute medians over repetitions**\n")
    out.append("| config | workload | " + " | ".join(m[0] for m in METRICS.values())
               + " | cached tokens (mean) |")  # fmt: skip
    out.append("|---" * (len(METRICS) + 3) + "|")
    for cfg in configs:
        for wl in workloads:
            rows = [by[(cfg, k)][wl] for k in reps if (cfg, k) in by]
            cells = [f"{statistics.median(r[key] for r in rows) * scale:.3g}{unit}"
                     for key, (_, scale, unit) in METRICS.items()]  # fmt: skip
            cached = statistics.median(r["cached_mean"] for r in rows)
            out.append(f"| {cfg} | {wl} | " + " | ".join(cells) + f" | {cached:.0f} |")
    out.append(_tokens(by, configs, workloads, reps))
    out.append("\nLoad: " + "; ".join(record["loads"]))
    return "\n".join(out) + "\n"


def _tokens(by: dict, configs: list[str], workloads: list[str], reps: list[int]) -> str:
    """What each server received and sent, over every run: prompt tokens (its usage),
    output tokens re-tokenized from the streamed text (aiperf's count) and in its usage."""
    out = ["\n**Tokens, as each server counted them (min-max over runs)**\n",
           "| config | prompt tokens (check) | prompt tokens (usage) | output tokens "
           "(text re-tokenized) | output tokens (usage) |", "|---|---|---|---|---|"]  # fmt: skip
    for cfg in configs:
        runs = [by[(cfg, k)] for k in reps if (cfg, k) in by]
        rows = [r[wl] for r in runs for wl in workloads]
        check = [r.get("prompt check", {}).get("prompt_tokens", 0) for r in runs]
        cells = [_range(check),
                 _range([r.get("prompt_tokens_min", 0) for r in rows]
                        + [r.get("prompt_tokens_max", 0) for r in rows]),
                 _range([r.get("tokens_min", 0) for r in rows]),
                 _range([r.get("usage_tokens_min", 0) for r in rows])]  # fmt: skip
        out.append(f"| {cfg} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def _range(xs: list[float]) -> str:
    xs = [x for x in xs if x]
    return f"{min(xs):.0f}-{max(xs):.0f}" if xs else "–"


def _spread(xs: list[float]) -> str:
    if not xs:
        return "–"
    return f"{statistics.median(xs):.2f} [{min(xs):.2f}-{max(xs):.2f}]"


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        sys.stdout.write(tables(json.load(f)))
