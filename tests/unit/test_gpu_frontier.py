"""studies/gpu-box/frontier.py: a bench case's placements replayed in the twin, makespan
against mean TTFT — a slow free worker buys TTFT with makespan, request by request."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "studies/gpu-box"))  # frontier.py imports study.py beside it
_spec = importlib.util.spec_from_file_location("frontier", ROOT / "studies/gpu-box/frontier.py")
frontier = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(frontier)

WORKLOAD = {"kind": "burst", "requests": 4, "spacing_s": 0.01, "rate_rps": 1.0,
            "duration_s": 30.0, "bursts": 1, "gap_s": 10.0, "hit_fraction": 1.0,
            "prefix_tokens": 64, "prompt_tokens": 68, "output_tokens": 128,
            "same_prompt": True, "trace": "",
            "trace_scale": {"length_scale": 16.0, "output_scale": 1.0, "time_scale": 1.0,
                            "limit": 0}}  # fmt: skip
# A fast worker with two slots, a slow one with two: 4 requests queue two on the fast one.
SERVED = {"cpu": {"prefill_tok_s": 800.0, "decode_tok_s": [100.0, 150.0]},
          "gpu": {"prefill_tok_s": 20000.0, "decode_tok_s": [500.0, 1000.0]}}  # fmt: skip


def doc() -> dict:
    runs = [{"run": i, "served_rates": SERVED, "records": []} for i in range(2)]
    return {
        "config": {"seed": 0, "workers": [{"spec": "sim:id=cpu:max_active=2", "id": "cpu"},
                                          {"spec": "sim:id=gpu:max_active=2", "id": "gpu"}]},
        "groups": [{"label": "burst4", "max_active": 2, "workload": WORKLOAD,
                    "cases": [{"router_policy": "least_loaded", "runs": runs},
                              {"router_policy": "lookahead", "runs": runs}]}],
    }  # fmt: skip


def rows(lines: list[str]) -> dict[str, tuple[float, float]]:
    out = {}
    for line in lines:
        m = re.fullmatch(r"\| (.+) \| ([0-9.]+) \| ([0-9.]+) \|", line)
        if m:
            out[m.group(1)] = (float(m.group(2)), float(m.group(3)))
    return out


def test_each_request_on_the_slow_worker_trades_makespan_for_ttft() -> None:
    got = rows(frontier.frontier(doc(), "burst4", "cpu", "gpu"))
    assert {"first 0 on cpu", "last 2 on cpu", "policy least_loaded", "policy lookahead"} <= set(
        got
    )
    all_fast, two_slow = got["first 0 on cpu"], got["first 2 on cpu"]
    assert two_slow[1] < all_fast[1]  # nothing queues: the first token comes sooner
    assert two_slow[0] > all_fast[0]  # the slow worker's 128 tokens end later
    assert got["first 0 on cpu"] == got["last 0 on cpu"]  # the same placement
