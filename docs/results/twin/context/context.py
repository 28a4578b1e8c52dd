"""Does pricing every step at the worker's median served context cost the default?

An experiment in the twin (sim devices, labelled): the Mooncake trace's first 300
requests (prompt lengths / 16: 13 to ~12,000 tokens) on the H200 fleet, lookahead,
with the CPU's decode steps either flat in context (sim h200-cpu: the steps it
served after 516-token prompts) or growing 4.8 us per context token per row
(h200-cpu-ctx.json beside this file: its steps after 16-token prompts plus the
slope that joins them to those after 516). The live step model quotes each batch
size's step at the median context it served and measures the slope, but the
finish_time replay prices every step at that median context: a long prompt on the
sloped CPU costs more per step than priced, a short one less.

Per request, the chosen worker's predicted seconds to the last token (its score
in the decision) against what the twin then took, by worker and prompt length.
Predictions ignore requests that arrive later and share the worker, so open-loop
traffic runs over its predictions even where the model is exact (the flat rows).

    python docs/results/twin/context/context.py > docs/results/twin/context/context.md
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path

from click.testing import CliRunner

from tandem.cli.main import main as cli

HERE = Path(__file__).resolve().parent
TRACE = HERE.parents[3].parent / "shared" / "traces" / "mooncake_synthetic.jsonl"
BANDS = ((500, "< 500"), (1500, "500-1,499"), (1 << 60, ">= 1,500"))


def run(cpu: str, out: Path) -> dict:
    args = ["sim", "--worker", f"sim:{cpu}:id=cpu:max_active=4"]
    args += ["--worker", "sim:h200-gpu:id=gpu:max_active=8", "--workload", "trace"]
    args += ["--trace", str(TRACE), "--length-scale", "16", "--limit", "300"]
    args += ["--policy", "lookahead", "--runs", "1", "--out", str(out)]
    res = CliRunner().invoke(cli, args, catch_exceptions=False)
    if res.exit_code != 0:
        sys.exit(res.output)
    return json.loads((out / "result.json").read_text())["groups"][0]["cases"][0]["runs"][0]


def errors(run_doc: dict) -> dict[tuple[str, str], list[float]]:
    """actual / predicted seconds to the last token, by (worker, prompt band)."""
    pred = {}
    for d in run_doc["decisions"]:
        scores = {c[0]: c[4] for c in d["candidates"]}
        pred[d["request"]] = scores[d["choice"]]
    out: dict[tuple[str, str], list[float]] = {}
    for r in run_doc["records"]:
        p = pred.get(r["request_id"])
        if not p:
            continue
        prompt = r["stats"]["prompt_tokens"]
        band = next(label for top, label in BANDS if prompt < top)
        out.setdefault((r["worker"], band), []).append((r["done_s"] - r["submit_s"]) / p)
    return out


def main() -> None:
    worlds = {"flat": "h200-cpu", "sloped": str(HERE / "h200-cpu-ctx.json")}
    print("actual / predicted seconds to the last token (median [p25, p75], requests)\n")
    print("| worker | prompt tokens | CPU flat in context | CPU 4.8 us / context token / row |")
    print("| --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as tmp:
        runs = {k: run(cpu, Path(tmp) / k) for k, cpu in worlds.items()}
    found = {k: errors(doc) for k, doc in runs.items()}
    for worker in ("cpu", "gpu"):
        for _, band in BANDS:
            cells = []
            for world in worlds:
                xs = sorted(found[world].get((worker, band), []))
                if not xs:
                    cells.append("-")
                    continue
                q = (xs[len(xs) // 4], xs[3 * len(xs) // 4])
                cells.append(f"{statistics.median(xs):.2f} [{q[0]:.2f}, {q[1]:.2f}], {len(xs)}")
            print(f"| {worker} | {band} | " + " | ".join(cells) + " |")
    print("\n| world | makespan s | TTFT mean s | e2e mean s | requests on the CPU |")
    print("| --- | --- | --- | --- | --- |")
    for world, doc in runs.items():
        m = doc["metrics"]
        on_cpu = sum(r["worker"] == "cpu" for r in doc["records"])
        cells = [m["makespan_s"], m["ttft_s"]["mean"], m["e2e_s"]["mean"]]
        print(f"| {world} | " + " | ".join(f"{x:.2f}" for x in cells) + f" | {on_cpu} |")


if __name__ == "__main__":
    main()
