"""A GPU-box campaign's bench results as a study's tables (issue 32).

    python3 studies/gpu-box/study.py summary RESULT.json            # on the box, per stage
    python3 studies/gpu-box/study.py readme h200-....tgz [more.tgz|DIR|result.json ...]
        [--title T] [--twin] [--out docs/results/h200/STUDY/README.md]

Per case (a bench group: burst size x GPU max active): each policy's makespan, mean
TTFT and mean E2E over its runs (mean +- the 95 % CI half-width, t over runs, n);
where the default policy wins, ties or loses against every fixed policy (a tie: the
difference of the means within the CI of that difference); every worker's start-up
(advertised) rates against the rates it served (the live decode steps the router
measured per batch size, the median over the group's runs; prefill: its priced rate),
as served / advertised; and with --twin, the twin's replay of each run's own
placement on the speeds that run served (twin/replay.py): its makespan and mean E2E
against the box's, as twin / box - 1 per case. Partial results (a stage cut by its
cap) are read too: a case's figures come from the runs it has.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tarfile
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}
MIN_LIVE_SAMPLES = 3  # live decode steps at a batch size before its rate is believed
FORCED = "forced:"


def ci(xs: Sequence[float]) -> tuple[float, float, int]:
    """Mean, 95 % CI half-width (t over runs; 0 for one run), n."""
    if not xs:
        return math.nan, math.nan, 0
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return m, 0.0, 1
    half = T95.get(len(xs) - 1, 2.0) * statistics.stdev(xs) / math.sqrt(len(xs))
    return m, half, len(xs)


def fmt(x: tuple[float, float, int]) -> str:
    m, half, n = x
    return "-" if n == 0 else f"{m:.2f} +- {half:.2f} ({n})"


def load(paths: Iterable[str]) -> list[tuple[str, dict[str, Any]]]:
    """(name, result document) for every result.json in the tgz files, folders or files."""
    out: list[tuple[str, dict[str, Any]]] = []
    for p in map(Path, paths):
        if p.suffix == ".tgz" or p.name.endswith(".tar.gz"):
            tmp = Path(tempfile.mkdtemp(prefix="study-"))
            with tarfile.open(p) as tar:
                tar.extractall(tmp, filter="data")
            found = sorted(tmp.rglob("result.json"))
            out += [(f"{p.stem}/{f.parent.name}", json.loads(f.read_text())) for f in found]
        elif p.is_dir():
            out += [
                (f.parent.name, json.loads(f.read_text())) for f in sorted(p.rglob("result.json"))
            ]
        else:
            out.append((p.parent.name, json.loads(p.read_text())))
    return out


def default_policy() -> str:
    try:
        from tandem.broker.policies import DEFAULT_POLICY
    except ImportError:
        return "lookahead"
    return DEFAULT_POLICY


def case_stats(case: dict[str, Any]) -> dict[str, tuple[float, float, int]]:
    runs = [
        r for r in case["runs"] if r["metrics"].get("completed") == r["metrics"].get("requests")
    ]
    return {
        "makespan": ci([r["metrics"]["makespan_s"] for r in runs]),
        "ttft": ci([r["metrics"]["ttft_s"]["mean"] for r in runs]),
        "e2e": ci([r["metrics"]["e2e_s"]["mean"] for r in runs]),
    }


def verdict(a: tuple[float, float, int], b: tuple[float, float, int]) -> str:
    """a (the default) against b on a lower-is-better figure: win, tie or loss, with a / b."""
    if a[2] == 0 or b[2] == 0:
        return "-"
    if min(a[2], b[2]) < 2:  # no spread to judge by
        return f"{a[0] / b[0]:.2f}x (1 run)"
    spread = math.hypot(a[1], b[1])
    word = "tie" if abs(a[0] - b[0]) <= spread else ("win" if a[0] < b[0] else "loss")
    return f"{word} ({a[0] / b[0]:.2f}x)"


def policy_table(group: dict[str, Any], default: str) -> list[str]:
    stats = {c["router_policy"]: case_stats(c) for c in group["cases"]}
    lines = [
        "| policy | makespan s | TTFT mean s | E2E mean s | on each worker (mean) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for c in group["cases"]:
        pol, s = c["router_policy"], stats[c["router_policy"]]
        name = f"**{pol} (default)**" if pol == default else pol
        lines.append(f"| {name} | {fmt(s['makespan'])} | {fmt(s['ttft'])} | {fmt(s['e2e'])} "
                     f"| {placement(c['runs'])} |")  # fmt: skip
    if default in stats:
        lines += [
            "",
            "| default vs | makespan | TTFT mean | E2E mean |",
            "| --- | --- | --- | --- |",
        ]
        for pol, s in stats.items():
            if pol != default:
                d = stats[default]
                cells = [verdict(d[k], s[k]) for k in ("makespan", "ttft", "e2e")]
                lines.append(f"| {pol} | {' | '.join(cells)} |")
    return lines


def placement(runs: Sequence[dict[str, Any]]) -> str:
    counts: dict[str, list[int]] = {}
    for r in runs:
        for wid, pw in r["metrics"].get("per_worker", {}).items():
            counts.setdefault(wid, []).append(pw["requests"])
    return ", ".join(f"{w} {statistics.fmean(n):.1f}" for w, n in sorted(counts.items()))


def served_by_batch(group: dict[str, Any], wid: str) -> tuple[float | None, list[float | None]]:
    """A worker's served prefill (priced) and live decode tok/s per batch size: the
    median over the group's runs, a batch size only where it had enough steps."""
    rows = [r["served_rates"][wid] for c in group["cases"] for r in c["runs"]
            if wid in r.get("served_rates", {})]  # fmt: skip
    if not rows:
        return None, []
    prefill = statistics.median(x["prefill_tok_s"] for x in rows)
    width = max(len(x.get("live_decode_tok_s") or []) for x in rows)
    decode: list[float | None] = []
    for b in range(width):
        live = [x["live_decode_tok_s"][b] for x in rows if _believed(x, b)]
        decode.append(statistics.median(live) if live else None)
    return prefill, decode


def _believed(rates: dict[str, Any], b: int) -> bool:
    live = rates.get("live_decode_tok_s") or []
    return b < len(live) and bool(live[b]) and rates["live_decode_samples"][b] >= MIN_LIVE_SAMPLES


def rates_table(group: dict[str, Any]) -> list[str]:
    adv = group.get("rates", {}).get("advertised") or {}
    head = "| worker | prefill tok/s adv -> served | decode tok/s by batch: adv -> served (ratio) |"
    lines = [head, "| --- | --- | --- |"]
    for wid, a in sorted(adv.items()):
        prefill, decode = served_by_batch(group, wid)
        cells = []
        for b, x in enumerate(a["decode_tok_s"], 1):
            s = decode[b - 1] if b - 1 < len(decode) else None
            cells.append(f"{b}: {x:.0f} -> {s:.0f} ({s / x:.2f})" if s else f"{b}: {x:.0f} -> -")
        p = (
            f"{a['prefill_tok_s']:.0f} -> {prefill:.0f} ({prefill / a['prefill_tok_s']:.2f})"
            if prefill
            else "-"
        )
        lines.append(f"| {wid} | {p} | {'; '.join(cells)} |")
    return lines


def twin_rows(doc: dict[str, Any], group: dict[str, Any], tokenizer: str | None) -> list[str]:
    """The twin's replay of each run's own placement on that run's served speeds,
    against the box: per policy, mean (twin / box - 1) of makespan and mean E2E."""
    from tandem.bench.calibrate import group_served
    from tandem.bench.spec import parse_worker
    from tandem.bench.workload import PromptBook, Workload
    from tandem.twin import device as twin_device
    from tandem.twin.oracle import run_placement, served_devices
    from tandem.twin.replay import replay

    served = group_served(group, "all")
    if not served:
        return []
    # The twin's devices take the embedded model's vocabulary; a shaped model's prompts
    # (Qwen's 151,936 ids) would be refused. Ids only decide prefix-cache hits here.
    twin_device.VOCAB_SIZE = max(twin_device.VOCAB_SIZE, 1 << 31)
    wl = Workload.from_json(group["workload"])
    book = PromptBook(_encoder(doc, tokenizer), wl)
    active = {w["id"]: parse_worker(w["spec"], set()).max_active or group["max_active"]
              for w in doc["config"]["workers"]}  # fmt: skip
    lines = ["| policy | makespan: twin / box - 1 | mean E2E: twin / box - 1 | runs |",
             "| --- | --- | --- | --- |"]  # fmt: skip
    for case in group["cases"]:
        mk, e2e = [], []
        for run in case["runs"]:
            arrivals = wl.arrivals(doc["config"]["seed"] + run["run"])
            own = run_placement(run, len(arrivals))
            if "" in own or not run.get("served_rates"):
                continue
            specs = served_devices({**served, **run["served_rates"]}, active)
            rep = replay(specs, "least_loaded", arrivals, book, seed_prefix=wl.seeds_prefix,
                         placement=dict(enumerate(own)))  # fmt: skip
            t0 = min(r.submit_s for r in rep.records)
            twin_mk = max(r.token_s[-1] for r in rep.records if r.token_s) - t0
            twin_e2e = statistics.fmean(
                r.token_s[-1] - r.submit_s for r in rep.records if r.token_s
            )
            mk.append(twin_mk / run["metrics"]["makespan_s"] - 1)
            e2e.append(twin_e2e / run["metrics"]["e2e_s"]["mean"] - 1)
        if mk:
            lines.append(f"| {case['router_policy']} | {statistics.fmean(mk):+.1%} "
                         f"(each {', '.join(f'{x:+.0%}' for x in mk)}) | "
                         f"{statistics.fmean(e2e):+.1%} | {len(mk)} |")  # fmt: skip
    return lines


def _encoder(doc: dict[str, Any], tokenizer: str | None) -> Any:
    """The served model's tokenizer: --tokenizer, else the result's GGUF where it
    exists here, else (a shaped model written on the box) Qwen2's vocabulary."""
    from tandem.common.model_files import default_model_path
    from tandem.common.tokenizer import TextTokenizer, tokenizer_spec_from_gguf

    models = [
        p for w in doc["config"]["workers"] for p in w["spec"].split(":") if p.endswith(".gguf")
    ]
    path = tokenizer or next((m for m in models if Path(m).exists()), None)
    if path is None and models:
        from studies.models.vocab_files import vocab_file

        path = str(vocab_file("qwen2"))
    return TextTokenizer(tokenizer_spec_from_gguf(path or default_model_path())).encode


def workers_line(doc: dict[str, Any]) -> str:
    return ", ".join(f"`{w['spec']}`" for w in doc["config"]["workers"])


def summary(paths: Sequence[str]) -> None:
    default = default_policy()
    for name, doc in load(paths):
        for group in doc["groups"]:
            print(
                f"-- {name} {group['label']} ({'complete' if doc.get('complete') else 'partial'})"
            )
            print("\n".join([*policy_table(group, default), "", *rates_table(group)]))


def readme(paths: Sequence[str], title: str, twin: bool, tokenizer: str | None) -> str:
    default = default_policy()
    out = [f"# {title}", "", "Generated by `studies/gpu-box/study.py readme` from the box's "
           "result.json files; mean +- 95 % CI half-width (n runs).", ""]  # fmt: skip
    for name, doc in load(paths):
        out += [f"## {name}", "", f"Workers: {workers_line(doc)}.", f"`{doc['command']}`", ""]
        for group in doc["groups"]:
            out += [f"### {group['label']}", "", *policy_table(group, default), ""]
            out += ["Start-up (advertised) against served rates:", "", *rates_table(group), ""]
            if twin:
                rows = twin_rows(doc, group, tokenizer)
                out += (["The twin replaying each run's own placement:", "", *rows, ""]
                        if rows else [])  # fmt: skip
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("summary")
    s.add_argument("paths", nargs="+")
    r = sub.add_parser("readme")
    r.add_argument("paths", nargs="+")
    r.add_argument("--title", default="H200: three engines on one box")
    r.add_argument("--twin", action="store_true", help="Replay every run in the twin.")
    r.add_argument("--tokenizer", default=None, help="A GGUF whose tokenizer the runs used.")
    r.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    if a.cmd == "summary":
        summary(a.paths)
        return 0
    text = readme(a.paths, a.title, a.twin, a.tokenizer)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(text + "\n")
    else:
        sys.stdout.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
