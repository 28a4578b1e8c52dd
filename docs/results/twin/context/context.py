"""Does pricing every step at the worker's median served context cost the default?

An experiment in the twin (sim devices, labelled): the Mooncake trace's first 300
requests (prompt lengths / 16: 13 to ~12,000 tokens) on the H200 fleet, lookahead,
with the CPU's decode steps either flat in context (sim h200-cpu: the steps it
served after 516-token prompts) or growing 4.8 us per context token per row
(h200-cpu-ctx.json beside this file: its steps after 16-token prompts plus the
slope that joins them to those after 516). The live step model quotes each batch
size's step at the median context it served and measures the slope; finish_time
(and lookahead on it) prices each new request's own row at its own context
(broker/policies/finish.py ``context_extra_s``). "blind" runs the sloped world with
that term taken out (every step at the quoted context, as before it existed).

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

from tandem.broker.policies import finish, lookahead
from tandem.cli.main import main as cli

HERE = Path(__file__).resolve().parent
TRACE = HERE.parents[3].parent / "shared" / "traces" / "mooncake_synthetic.jsonl"
BANDS = ((500, "< 500"), (1500, "500-1,499"), (1 << 60, ">= 1,500"))


def run(cpu: str, out: Path, limit: int = 300, time_scale: float = 1.0) -> dict:
    args = ["sim", "--worker", f"sim:{cpu}:id=cpu:max_active=4"]
    args += ["--worker", "sim:h200-gpu:id=gpu:max_active=8", "--workload", "trace"]
    args += ["--trace", str(TRACE), "--length-scale", "16", "--limit", str(limit)]
    args += ["--time-scale", str(time_scale)]
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


def blind(*_: object) -> float:
    return 0.0


def main() -> None:
    sloped = str(HERE / "h200-cpu-ctx.json")
    worlds = {"flat": "h200-cpu", "sloped, blind": sloped, "sloped": sloped}
    print("actual / predicted seconds to the last token (median [p25, p75], requests),")
    print("the first 300 requests, arrivals as recorded\n")
    head = ["CPU flat in context", "CPU sloped, priced blind", "CPU sloped"]
    print("| worker | prompt tokens | " + " | ".join(head) + " |")
    print("| --- | --- | --- | --- | --- |")
    loads = ((300, 1.0), (300, 2.0), (600, 1.0))  # (first N requests, arrivals compressed)
    runs: dict[tuple[int, float], dict[str, dict]] = {load: {} for load in loads}
    own = finish.context_extra_s
    with tempfile.TemporaryDirectory() as tmp:
        for load in loads:
            for k, cpu in worlds.items():
                finish.context_extra_s = blind if "blind" in k else own
                lookahead.context_extra_s = finish.context_extra_s
                out = Path(tmp) / f"{k.replace(', ', '-')}-{load[0]}-{load[1]}"
                runs[load][k] = run(cpu, out, *load)
    finish.context_extra_s = lookahead.context_extra_s = own
    found = {k: errors(doc) for k, doc in runs[loads[0]].items()}
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
    print("\nOutcomes, lookahead: the first N requests, arrivals compressed by a factor\n")
    print(
        "| requests, arrivals / | world | makespan s | TTFT mean s | TTFT p99 s | e2e mean s |"
        " e2e p99 s | requests on the CPU |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for (limit, scale), by_world in runs.items():
        for world, doc in by_world.items():
            m = doc["metrics"]
            on_cpu = sum(r["worker"] == "cpu" for r in doc["records"])
            cells = [m["makespan_s"], m["ttft_s"]["mean"], m["ttft_s"]["p99"], m["e2e_s"]["mean"]]
            cells.append(m["e2e_s"]["p99"])
            row = " | ".join(f"{x:.2f}" for x in cells)
            print(f"| {limit}, {scale:g} | {world} | {row} | {on_cpu} |")


if __name__ == "__main__":
    main()
