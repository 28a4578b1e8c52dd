"""The bench's outer loop: groups, interleaved runs, the CV rule, saving, rendering."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tqdm import tqdm

from tandem.bench import stats
from tandem.bench.experiment import Bench, BenchConfig, resolve_policy
from tandem.bench.spec import WorkerArg
from tandem.bench.workload import Workload
from tandem.client.errors import TandemError
from tandem.common.affinity import cpu_name


def make_encoder(workers: Iterable[WorkerArg]) -> Any:
    """Tokenize prompts with the model the workers serve: the first spec's GGUF, else the
    embedded default (what every worker loads when no model is named)."""
    from tandem.common.model_files import default_model_path
    from tandem.common.tokenizer import TextTokenizer, tokenizer_spec_from_gguf

    gguf = next((w.model for w in workers if w.model and w.model.endswith(".gguf")), None)
    return TextTokenizer(tokenizer_spec_from_gguf(gguf or default_model_path())).encode


def machine_info() -> dict[str, Any]:
    """Enough to say where a result was measured."""
    cpu = cpu_name()
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "load_avg_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }
    if shutil.which("nvidia-smi"):
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
        info["gpus"] = out.stdout.strip().splitlines()
    return info


def save(doc: dict[str, Any], out_dir: Path) -> Path:
    """Write result.json atomically (a reader never sees half a file)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "result.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, separators=(",", ":")))
    tmp.replace(path)
    return path


def new_doc(cfg: BenchConfig, command: str, **machine: Any) -> dict[str, Any]:
    """An empty result document: what ran, where and when; groups come as they finish."""
    return {
        "version": 1,
        "command": command,
        "machine": machine_info() | machine,
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "config": cfg.to_json(),
        "groups": [],
        "complete": False,
    }


def run_bench(cfg: BenchConfig, out_dir: Path, command: str, progress: bool = True) -> dict:
    """Run everything ``cfg`` names; write result.json, report.md and plots to ``out_dir``."""
    doc = new_doc(cfg, command)
    bench = Bench(cfg, make_encoder(cfg.workers), doc)
    groups = [(m, wl) for m in cfg.max_active for wl in cfg.workloads]
    total = len(groups) * len(cfg.policies) * cfg.runs
    bar = tqdm(total=total, unit="run", file=sys.stderr, disable=not progress, mininterval=1)
    t_start = time.monotonic()
    try:
        for max_active, wl in groups:
            doc["groups"].append(_run_group(bench, wl, max_active, bar, out_dir))
    finally:
        bar.close()
    return finish_doc(doc, out_dir, t_start)


def finish_doc(doc: dict[str, Any], out_dir: Path, t_start: float) -> dict[str, Any]:
    """Mark ``doc`` complete (``t_start``: its monotonic start) and write every output."""
    doc["complete"] = True
    doc["wall_s"] = time.monotonic() - t_start
    save(doc, out_dir)
    write_outputs(doc, out_dir)
    return doc


def _run_group(bench: Bench, wl: Workload, max_active: int, bar: tqdm, out_dir: Path) -> dict:
    """Calibrate, then every policy's runs (interleaved, each round in a rotated
    order), then the CV rule's extra runs; with ``reuse_workers`` all of it on one
    set of workers."""
    with bench.group_workers(wl, max_active):
        return _run_cases(bench, wl, max_active, bar, out_dir)


def _run_cases(bench: Bench, wl: Workload, max_active: int, bar: tqdm, out_dir: Path) -> dict:
    cfg = bench.cfg
    bar.set_description(f"{wl.label} a{max_active}: measuring rates")
    rates = bench.calibrate(wl, max_active)
    group: dict[str, Any] = {
        "label": f"{wl.label}-active{max_active}",
        "max_active": max_active,
        "workload": wl.to_json(),
        "rates": rates,
        "cases": [],
    }
    bench.doc["groups"].append(group)  # visible in the partial saves
    cases: dict[str, dict[str, Any]] = {
        p: {"policy": p, "router_policy": resolve_policy(p, rates["used"]), "runs": []}
        for p in cfg.policies
    }
    group["cases"] = list(cases.values())

    def one(policy: str, run: int, position: int) -> None:
        case = cases[policy]
        bar.set_description(f"{group['label']} {case['router_policy']} run {run + 1}")
        try:
            res = bench.run_once(wl, max_active, case["router_policy"], run, rates["used"])
        except (TandemError, RuntimeError, TimeoutError) as exc:
            # A cluster that failed to start or seed measured nothing: try once more,
            # and say so in the record. (Request errors during a run are kept instead.)
            res = bench.run_once(wl, max_active, case["router_policy"], run, rates["used"])
            res["retried_after"] = f"{type(exc).__name__}: {exc}"
        res["position"] = position  # its place in its round (0: first)
        case["runs"].append(res)
        bar.update()
        bar.set_postfix(makespan=f"{res['metrics']['makespan_s']:.2f}s")
        save(bench.doc, out_dir)

    for run in range(cfg.runs):
        for position, policy in enumerate(rotated(cfg.policies, run)):
            one(policy, run, position)
    extra = [p for p in cfg.policies if stats.needs_more_runs(cases[p]["runs"])]
    bar.total = (bar.total or 0) + len(extra) * stats.EXTRA_RUNS
    bar.refresh()
    for run in range(cfg.runs, cfg.runs + stats.EXTRA_RUNS):
        for position, policy in enumerate(rotated(extra, run)):
            one(policy, run, position)
    for policy, case in cases.items():
        case["extra_runs_added"] = policy in extra
        case["summary"] = stats.summarize_runs(case["runs"])
    bench.doc["groups"].pop()  # the caller appends the finished group
    return group


def rotated(policies: Sequence[str], run: int) -> list[str]:
    """The order of one round: round ``run`` starts at policy ``run`` (mod their
    number), so over as many rounds every policy runs once in every place. A
    fixed order gives each policy the same predecessor every round — and with
    reused workers, the predecessor's step windows and caches at its start — so a
    place in the round would read as a policy's own speed."""
    if not policies:
        return []
    k = run % len(policies)
    return [*policies[k:], *policies[:k]]


def write_outputs(doc: dict[str, Any], out_dir: Path) -> list[Path]:
    """report.md and the PNG plots, from the result document alone."""
    from tandem.bench.plots import make_plots
    from tandem.bench.report import render_report

    plots = make_plots(doc, out_dir)
    report = out_dir / "report.md"
    report.write_text(render_report(doc, [p.name for p in plots]))
    return [report, *plots]
