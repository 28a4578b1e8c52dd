"""The markdown report of a result document (``tandem bench report RESULT.json``)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from tandem.bench.calibrate import group_served
from tandem.bench.plots import slug
from tandem.bench.spec import parse_worker
from tandem.bench.stats import summarize_runs
from tandem.broker.policies import DEFAULT_POLICY
from tandem.common.steptime import batch_ladder

_DEFAULT = DEFAULT_POLICY


def _ms(s: dict[str, Any], key: str, scale: float = 1.0, digits: int = 2) -> str:
    """``mean ± std`` of one summarized metric, or ``-``."""
    m = s.get(key)
    if not m:
        return "-"
    return f"{m['mean'] * scale:.{digits}f} ± {m['std'] * scale:.{digits}f}"


def _summary(case: dict[str, Any]) -> dict[str, Any]:
    """The case's summary; computed here for a partial result (an interrupted bench)."""
    if "summary" not in case:
        case["summary"] = summarize_runs(case["runs"]) if case["runs"] else {}
    return case["summary"]


def _mean(case: dict[str, Any], key: str) -> float | None:
    m = _summary(case).get(key)
    return m["mean"] if m else None


def _pct(new: float | None, old: float | None) -> str:
    return f"{100 * (new / old - 1):+.1f} %" if new and old else "-"


def results_table(group: dict[str, Any]) -> list[str]:
    """One row per policy: makespan, oracle, throughput, latency percentiles, placement."""
    cases = group["cases"]
    base = cases[0]
    head = (
        f"| policy | runs | makespan s | vs {base['router_policy']} | oracle s | "
        "measured / oracle | / oracle (served rates) | output tok/s | TTFT p50 s | TTFT p95 s "
        "| e2e p50 s | e2e p95 s | e2e p99 s | ITL p50 ms | ITL p99 ms | queue p50 s "
        "| requests per worker (mean) |"
    )
    lines = [head, "|" + " --- |" * 17]
    for c in cases:
        s = _summary(c)
        placement = ", ".join(
            f"{k.split('.', 1)[1]} {v['mean']:.1f}"
            for k, v in sorted(s.items())
            if k.startswith("requests.") and v["mean"] > 0
        )
        extra = " (+2: CV > 5 %)" if c.get("extra_runs_added") else ""
        row = [
            c["router_policy"],
            f"{len(c['runs'])}{extra}",
            _ms(s, "makespan_s"),
            _pct(_mean(c, "makespan_s"), _mean(base, "makespan_s")),
            _ms(s, "oracle_makespan_s"),
            _ms(s, "vs_oracle"),
            _ms(s, "vs_oracle_served"),
            _ms(s, "output_tok_s", digits=1),
            _ms(s, "ttft_s.p50"),
            _ms(s, "ttft_s.p95"),
            _ms(s, "e2e_s.p50"),
            _ms(s, "e2e_s.p95"),
            _ms(s, "e2e_s.p99"),
            _ms(s, "itl_s.p50", 1000, 1),
            _ms(s, "itl_s.p99", 1000, 1),
            _ms(s, "queue_s.p50"),
            placement,
        ]
        lines.append("| " + " | ".join(row) + " |")
    return lines


def latency_table(group: dict[str, Any], slo_s: float | None) -> list[str]:
    """Open-loop view per policy: TTFT and end-to-end mean / p50 / p99, goodput."""
    slo = f"TTFT <= {slo_s:g} s" if slo_s else "TTFT SLO"
    lines = [
        "| policy | TTFT mean s | TTFT p50 s | TTFT p99 s | e2e mean s | e2e p50 s | e2e p99 s "
        f"| goodput ({slo}) | goodput req/s |",
        "|" + " --- |" * 9,
    ]
    for c in group["cases"]:
        s = _summary(c)
        cells = [_ms(s, f"{m}.{q}") for m in ("ttft_s", "e2e_s") for q in ("mean", "p50", "p99")]
        frac = s.get("goodput_fraction")
        good = f"{100 * frac['mean']:.1f} %" if frac else "-"
        lines.append(
            f"| {c['router_policy']} | " + " | ".join(cells) + f" | {good} | "
            f"{_ms(s, 'goodput_rps')} |"
        )
    return lines


def _workload_line(wl: dict[str, Any], active: str, rates: str) -> str:
    if wl["kind"] == "trace":
        sc = wl["trace_scale"]
        return (
            f"trace `{wl['trace']}`: prompt lengths / {sc['length_scale']:g} (each 512-token "
            f"block -> {max(1, round(512 / sc['length_scale']))} tokens, sharing kept), outputs "
            f"/ {sc['output_scale']:g}, arrival times / {sc['time_scale']:g}"
            + (f", first {sc['limit']} requests" if sc["limit"] else "")
            + f"; no seeded prefix; max active per worker: {active}; oracle from {rates} rates."
        )
    return (
        f"{wl['kind']}; {wl['prompt_tokens']}-token prompts, {wl['prefix_tokens']} of them the "
        f"seeded prefix for {100 * wl['hit_fraction']:.0f} % of requests; "
        f"{wl['output_tokens']} output tokens (EOS ignored); max active per worker: "
        f"{active}; oracle from {rates} rates."
    )


def headline(group: dict[str, Any]) -> str | None:
    """The default policy against the first policy, the best other policy and the oracle."""
    cases = {c["router_policy"]: c for c in group["cases"]}
    pc = cases.get(_DEFAULT)
    if not pc or not _summary(pc):
        return None
    first = group["cases"][0]
    others = [c for c in group["cases"] if c is not pc and _summary(c)]
    parts = [f"{_DEFAULT} makespan {_mean(pc, 'makespan_s'):.2f} s"]
    if first is not pc:
        parts.append(
            f"{_pct(_mean(pc, 'makespan_s'), _mean(first, 'makespan_s'))} vs "
            f"{first['router_policy']}"
        )
    if others:
        best = min(others, key=lambda c: _mean(c, "makespan_s") or float("inf"))
        parts.append(
            f"{_pct(_mean(pc, 'makespan_s'), _mean(best, 'makespan_s'))} vs the best other "
            f"policy ({best['router_policy']}, {_mean(best, 'makespan_s'):.2f} s)"
        )
    if _mean(pc, "vs_oracle"):
        parts.append(f"{_mean(pc, 'vs_oracle'):.2f}x the oracle bound")
    if _mean(pc, "vs_oracle_served"):
        parts.append(f"{_mean(pc, 'vs_oracle_served'):.2f}x the bound from served rates")
    if _mean(pc, "vs_twin_oracle"):
        parts.append(
            f"{_mean(pc, 'vs_twin_oracle'):.2f}x the twin's best placement (placement loss "
            f"{_mean(pc, 'twin_placement_loss'):.2f}x)"
        )
    return "; ".join(parts) + "."


def placement_lines(group: dict[str, Any]) -> list[str]:
    """Per policy and run: requests per worker; for small runs, which request went where."""
    out = []
    for c in group["cases"]:
        runs = []
        for run in c["runs"]:
            counts = Counter(r.get("worker") or "error" for r in run["records"])
            text = ", ".join(f"{w} {n}" for w, n in sorted(counts.items()))
            if len(run["records"]) <= 16 and len(counts) > 1:
                minority = min(counts, key=lambda w: counts[w])
                idx = [r["index"] + 1 for r in run["records"] if r.get("worker") == minority]
                text += f" ({minority}: #{', #'.join(map(str, idx))})"
            runs.append(text)
        out.append(f"- {c['router_policy']}: " + "; ".join(runs))
    if group["cases"] and group["cases"][0]["runs"] and group["cases"][0]["runs"][0]["oracle"]:
        oracle = group["cases"][0]["runs"][0]["oracle"]["requests"]
        out.append(f"- oracle's best assignment (run 1): {oracle}")
    return out


def rates_table(group: dict[str, Any]) -> list[str]:
    rates = group["rates"]
    lines = [
        "| worker | advertised prefill / decode b=1 / peak tok/s | measured |",
        "| --- | --- | --- |",
    ]
    for w, adv in sorted(rates["advertised"].items()):
        mea = (rates.get("measured") or {}).get(w)

        def fmt(r: dict[str, float] | None) -> str:
            if not r:
                return "-"
            rates = (r["prefill_tok_s"], r["decode_tok_s_1"], r["decode_tok_s_peak"])
            return " / ".join(f"{x:.0f}" for x in rates)

        lines.append(f"| {w} | {fmt(adv)} | {fmt(mea)} |")
    return lines


def served_table(group: dict[str, Any]) -> list[str]:
    """Advertised decode tok/s by batch size against what the router priced at each
    run's end (live steps of serving): the warm-up's word against serving's."""
    runs = [r for c in group["cases"] for r in c["runs"] if r.get("served_rates")]
    if not runs:
        return []
    lines = [
        "Decode tok/s by batch size: advertised at registration, then priced at the end of "
        "each run (live steps; median over runs, with the live step samples of the last run):",
        "",
        "| worker | batch | advertised | served (median of runs) | live samples |",
        "| --- | --- | --- | --- | --- |",
    ]
    served = group_served(group)
    for w, adv in sorted(group["rates"]["advertised"].items()):
        by_batch = adv.get("decode_tok_s") or []
        last = runs[-1]["served_rates"].get(w, {})
        at = served.get(w, {}).get("decode_tok_s") or []
        for b in batch_ladder(len(by_batch)):
            n = (last.get("live_decode_samples") or [])[b - 1 : b] or ["-"]
            med = f"{at[b - 1]:.0f}" if len(at) >= b else "-"
            lines.append(f"| {w} | {b} | {by_batch[b - 1]:.0f} | {med} | {n[0]} |")
    return lines


def twin_table(group: dict[str, Any]) -> list[str]:
    """Per policy: measured against the twin's best placement, split into what the
    placement lost (itself split: the run's live prices against the policy's own
    choices on right prices, and the policy's objective against the best) and what
    the twin's device model misses (twin/oracle.py)."""
    cases = [c for c in group["cases"] if "vs_twin_oracle" in _summary(c)]
    if not cases:
        return []
    first = next(r["twin_oracle"] for c in cases for r in c["runs"])
    runs = {
        "shared": "median over this group's runs that used every worker",
        "placement": "median over this group's runs that used every worker for split "
        "placements, over the runs of that worker alone for one-worker placements",
        "run": "those served in each run itself: a best placement per run",
    }.get(group.get("twin_served_from", "all"), "median over this group's runs")
    lines = [
        "Twin oracle: the run's arrivals replayed through the twin with every request "
        f"pinned, on the workers' served step times ({runs}); the "
        f"best placement found ({'every placement tried' if first['exact'] else 'search'}; "
        f"run 1: {first['requests']}, {first['makespan_s']:.2f} s):",
        "",
        "| policy | measured / twin best | placement loss (twin own / twin best) "
        "| = pricing (twin own / policy in the twin) | x objective (policy in the twin / "
        "twin best) | model gap (measured / twin own) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    keys = ("vs_twin_oracle", "twin_placement_loss", "twin_pricing_loss",
            "twin_objective_loss", "twin_model_gap")  # fmt: skip
    for c in cases:
        s = _summary(c)
        cells = [_ms(s, k) if k in s else "-" for k in keys]
        lines.append(f"| {c['router_policy']} | " + " | ".join(cells) + " |")
    return lines


def _active(cfg: dict[str, Any], group: dict[str, Any]) -> str:
    """Each worker's max active in ``group``: its spec's own value, else the group's."""
    return ", ".join(
        f"{w['id']} {parse_worker(w['spec'], set()).max_active or group['max_active']}"
        for w in cfg["workers"]
    )


def _rate_source(group: dict[str, Any]) -> str:
    return "/".join(sorted({r.get("source", "?") for r in group["rates"]["used"].values()}))


def _commands(doc: dict[str, Any]) -> list[str]:
    merged = doc.get("merged_from")
    if not merged:
        return [f"Command: `{doc['command']}`"]
    lines = [f"Merged from {len(merged)} bench invocations (`tandem bench merge`):", ""]
    return lines + [f"- `{m['command']}` (started {m['started']})" for m in merged]


def render_report(doc: dict[str, Any], plots: list[str]) -> str:
    """The whole report; ``plots`` are file names next to it."""
    cfg, mach = doc["config"], doc["machine"]
    lines = [
        f"# tandem bench{': preset ' + cfg['preset'] if cfg.get('preset') else ''}",
        "",
        *_commands(doc),
        "",
        f"Machine: {mach.get('cpu')}, {mach.get('cores')} cores, {mach.get('platform')}; "
        f"GPUs: {', '.join(mach.get('gpus') or ['none'])}; load average at start "
        f"{mach.get('load_avg_at_start')}. Started {doc['started']}"
        + (f", took {doc['wall_s'] / 60:.1f} min." if doc.get("wall_s") else "."),
        "",
        "Workers: " + ", ".join(f"`{w['spec']}` (id {w['id']})" for w in cfg["workers"]) + ".",
        f"Runs per case: {cfg['runs']} (+2 when makespan or output tok/s varies by more than "
        f"{100 * cfg['cv_rule']['limit']:.0f} % CV). Each run: "
        + (
            "the group's workers (started once), a fresh router"
            if cfg.get("reuse_workers")
            else "a fresh cluster"
        )
        + ", the prefix seeded into every worker, the workload. Values: mean ± sample std "
        "over runs; latency percentiles are per run, then averaged. Oracle: the shortest "
        "makespan any assignment could reach under a throughput model of the workers' rates "
        "(bench/oracle.py); served rates: what the router priced each worker with at the "
        "run's end, from the steps it ran while serving.",
    ]
    if any(w["spec"].startswith("sim") for w in cfg["workers"]):
        lines += [
            "",
            "Sim workers play back their profile's timings: they test routing, not devices.",
        ]
    if not doc.get("complete"):
        what = "a merged invocation" if doc.get("merged_from") else "the bench"
        lines += ["", f"**Incomplete**: {what} did not finish; this is what it measured."]
    for group in doc["groups"]:
        wl = group["workload"]
        lines += ["", f"## {group['label']}", ""]
        lines.append(_workload_line(wl, _active(cfg, group), _rate_source(group)))
        hl = headline(group)
        if hl:
            lines += ["", f"**{hl}**"]
        lines += ["", *results_table(group), ""]
        lines += [*latency_table(group, cfg.get("ttft_slo_s")), ""]
        lines += ["Rates (tok/s):", "", *rates_table(group)]
        for extra in (served_table(group), twin_table(group)):
            if extra:
                lines += ["", *extra]
        lines += ["", "Placement per run:", "", *placement_lines(group), ""]
        prefix = slug(group["label"]) + "-"
        lines += [f"![{p}]({p})" for p in plots if p.startswith(prefix)]
    lines += [f"![{p}]({p})" for p in plots if p.startswith("sweep-")]
    return "\n".join(lines) + "\n"
