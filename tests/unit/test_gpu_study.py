"""studies/gpu-box/study.py: a campaign's results as a study's tables — the default's
win/tie/loss against each fixed policy (a tie within the spread), and each worker's
advertised against served rates per batch size, on a partial (cut) result too."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("study", ROOT / "studies/gpu-box/study.py")
study = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(study)


def run(i: int, makespan: float, ttft: float, workers: dict[str, int]) -> dict:
    live = {"cpu": [100.0, 180.0], "gpu": [60.0, 115.0]}
    return {
        "run": i,
        "metrics": {
            "requests": 8,
            "completed": 8,
            "makespan_s": makespan,
            "ttft_s": {"mean": ttft},
            "e2e_s": {"mean": makespan / 2},
            "per_worker": {w: {"requests": n} for w, n in workers.items()},
        },
        "served_rates": {
            w: {
                "prefill_tok_s": 900.0 if w == "cpu" else 9000.0,
                "decode_tok_s": d,
                "live_decode_tok_s": d,
                "live_decode_samples": [10, 2],
            }  # fmt: skip
            for w, d in live.items()
        },
    }


def doc() -> dict:
    adv = {"cpu": ([100.0, 200.0], 1000.0), "gpu": ([120.0, 230.0], 12000.0)}
    cases = [
        ("forced:gpu", [5.0, 5.2, 4.8], {"cpu": 0, "gpu": 8}),
        ("least_loaded", [3.1, 3.0, 2.9], {"cpu": 4, "gpu": 4}),
        ("lookahead", [3.0, 3.05, 2.95], {"cpu": 3, "gpu": 5}),
    ]
    return {
        "command": "tandem bench ...",
        "complete": False,  # a stage cut by its cap: no summaries
        "config": {"workers": [{"spec": "llama.cpp:id=cpu", "id": "cpu"}], "seed": 0},
        "groups": [
            {
                "label": "burst8-hit100-active4",
                "rates": {
                    "advertised": {
                        w: {"decode_tok_s": d, "prefill_tok_s": p} for w, (d, p) in adv.items()
                    }
                },
                "cases": [
                    {
                        "router_policy": pol,
                        "runs": [run(i, m, m / 10, ws) for i, m in enumerate(ms)],
                    }
                    for pol, ms, ws in cases
                ],
            }
        ],
    }


def test_the_default_wins_outside_the_spread_and_ties_inside_it():
    lines = study.policy_table(doc()["groups"][0], "lookahead")
    text = "\n".join(lines)
    assert "| **lookahead (default)** | 3.00 +- 0.12 (3) |" in text
    vs = {line.split(" | ")[0].strip("| "): line for line in lines if line.startswith("| forced")
          or line.startswith("| least_loaded |")}  # fmt: skip
    assert "win (0.60x)" in vs["forced:gpu"]
    assert "tie (1.00x)" in vs["least_loaded"]
    assert "cpu 3.0, gpu 5.0" in text  # where the default's requests went


def test_rates_compare_served_steps_with_the_start_up_prices_per_batch():
    rows = study.rates_table(doc()["groups"][0])
    cpu = next(r for r in rows if r.startswith("| cpu |"))
    # prefill priced 900 vs 1000 advertised; batch 1 served 100 of 100; batch 2 had 2
    # live steps only (< 3): not believed, so no ratio.
    assert "1000 -> 900 (0.90)" in cpu and "1: 100 -> 100 (1.00)" in cpu and "2: 200 -> -" in cpu
    gpu = next(r for r in rows if r.startswith("| gpu |"))
    assert "1: 120 -> 60 (0.50)" in gpu


def test_one_run_gives_a_ratio_without_a_verdict(tmp_path, capsys):
    assert study.verdict((2.0, 0.0, 1), (4.0, 0.0, 1)) == "0.50x (1 run)"
    path = tmp_path / "cut" / "result.json"
    path.parent.mkdir()
    path.write_text(json.dumps(doc()))
    study.main(["summary", str(path)])
    out = capsys.readouterr().out
    assert "-- cut burst8-hit100-active4 (partial)" in out and "| least_loaded |" in out
