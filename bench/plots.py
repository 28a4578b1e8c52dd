"""PNG plots from a result document: per-worker timelines, TTFT / latency CDFs, sweeps.

Drawn from the JSON alone (``tandem bench report`` re-renders them). Timelines
show each case's first run: one bar per request, split into queue (submit ->
admitted), prefill (admitted -> first token) and decode (first -> last token).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402

_COLORS = {"queue": "#bbbbbb", "prefill": "#e8871e", "decode": "#2b6cb0"}
DPI = 90
TIMELINE_MAX_REQUESTS = 300


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")


def make_plots(doc: dict[str, Any], out_dir: Path) -> list[Path]:
    """Every plot for ``doc``; returns the files written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files: list[Path] = []
    for group in doc["groups"]:
        files.append(cdf_plot(group, out_dir / f"{slug(group['label'])}-cdf.png"))
        for case in group["cases"]:
            # One bar per request: past a few hundred the figure is unreadable (and huge).
            if case["runs"] and len(case["runs"][0]["records"]) <= TIMELINE_MAX_REQUESTS:
                name = f"{slug(group['label'])}-{slug(case['router_policy'])}-timeline.png"
                files.append(timeline_plot(group, case, out_dir / name))
    if len({g["max_active"] for g in doc["groups"]}) > 1:
        files.append(sweep_plot(doc, out_dir / "sweep-max-active.png"))
    return files


def _segments(rec: dict[str, Any]) -> tuple[float, float, float, float] | None:
    """(submit, admitted, first token, last token) seconds, or None if it never produced."""
    if rec.get("first_token_s") is None:
        return None
    submit, first, last = rec["submit_s"], rec["first_token_s"], rec["last_token_s"]
    admitted = min(first, submit + float(rec["stats"].get("queue_s") or 0.0))
    return submit, admitted, first, last


def timeline_plot(group: dict[str, Any], case: dict[str, Any], path: Path) -> Path:
    """One panel per worker; one row per request it ran (first run of the case)."""
    run = case["runs"][0]
    # Every worker gets a panel, an idle one too: under forced routing that is the point.
    seen = {r["worker"] for r in run["records"] if r.get("worker")}
    workers = sorted(seen | set(group["rates"]["advertised"])) or ["?"]
    heights = [max(1, sum(r.get("worker") == w for r in run["records"])) for w in workers]
    fig, axes = plt.subplots(
        len(workers),
        1,
        sharex=True,
        squeeze=False,
        figsize=(9, 1.2 + 0.18 * sum(heights) + 0.5 * len(workers)),
        gridspec_kw={"height_ratios": heights},
    )
    for ax, w in zip(axes[:, 0], workers, strict=True):
        recs = sorted((r for r in run["records"] if r.get("worker") == w), key=lambda r: r["index"])
        for row, rec in enumerate(recs):
            seg = _segments(rec)
            if seg is None:
                continue
            s, a, f, e = seg
            for (x0, x1), part in zip(((s, a), (a, f), (f, e)), _COLORS, strict=True):
                ax.barh(row, x1 - x0, left=x0, height=0.8, color=_COLORS[part])
        ax.set_yticks(range(len(recs)), [f"#{r['index'] + 1}" for r in recs], fontsize=6)
        ax.invert_yaxis()
        ax.set_ylabel(w, fontsize=8)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in _COLORS.values()]
    axes[0, 0].legend(
        handles, list(_COLORS), ncol=3, fontsize=7, loc="lower right", bbox_to_anchor=(1, 1)
    )
    axes[-1, 0].set_xlabel("seconds from the first submit")
    fig.suptitle(f"{group['label']}: {case['router_policy']} (run 1), one bar per request")
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def _ecdf(ax: Any, values: list[float], label: str) -> None:
    xs = sorted(values)
    if xs:
        ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post", label=label)


def cdf_plot(group: dict[str, Any], path: Path) -> Path:
    """TTFT and end-to-end latency CDFs per policy, all runs pooled."""
    fig, (ax_t, ax_e) = plt.subplots(1, 2, figsize=(10, 3.8))
    for case in group["cases"]:
        recs = [r for run in case["runs"] for r in run["records"] if r.get("first_token_s")]
        _ecdf(ax_t, [r["first_token_s"] - r["submit_s"] for r in recs], case["router_policy"])
        _ecdf(ax_e, [r["last_token_s"] - r["submit_s"] for r in recs], case["router_policy"])
    for ax, name in ((ax_t, "TTFT (s, log)"), (ax_e, "end-to-end latency (s, log)")):
        ax.set_xscale("log")  # policies differ by orders of magnitude (forced-CPU vs GPU)
        ax.set_xlabel(name)
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
    ax_e.legend(fontsize=7)
    fig.suptitle(f"{group['label']}: latency CDFs (all runs)")
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def sweep_plot(doc: dict[str, Any], path: Path) -> Path:
    """Mean makespan per policy against max_active, one line per workload and policy."""
    fig, ax = plt.subplots(figsize=(7, 4))
    lines: dict[tuple[str, str], list[tuple[int, float, float]]] = {}
    for group in doc["groups"]:
        wl = group["label"].rsplit("-active", 1)[0]
        for case in group["cases"]:
            m = case.get("summary", {}).get("makespan_s")
            if m:
                key = (wl, case["policy"])
                lines.setdefault(key, []).append((group["max_active"], m["mean"], m["std"]))
    for (wl, policy), pts in sorted(lines.items()):
        pts.sort()
        xs, ys, errs = ([p[i] for p in pts] for i in range(3))
        ax.errorbar(xs, ys, errs, marker="o", capsize=3, label=f"{wl} {policy}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("max active requests (of the swept workers)")
    ax.set_ylabel("makespan (s), mean ± std")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path
