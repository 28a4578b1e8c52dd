"""The virtual-time twin: deterministic replays that match the bench, traces, the CLI."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from tandem.bench.trace import TraceScale, load_trace, trace_prompt
from tandem.bench.workload import PromptBook, Workload
from tandem.cli.main import main
from tandem.twin.replay import TwinWorkerSpec, replay
from tandem.twin.world import Links
from tandem.workers.device_model import SimProfile


def encode(text: str) -> list[int]:
    """A stand-in tokenizer: one id per character (the twin needs ids, not a model)."""
    return [1000 + ord(c) % 500 for c in text]


def fleet() -> list[TwinWorkerSpec]:
    return [
        TwinWorkerSpec("cpu-m2", SimProfile.load("cpu-m2")),
        TwinWorkerSpec("gpu-m2", SimProfile.load("gpu-m2")),
    ]


def run(policy: str, n: int = 8, **kw) -> tuple[float, Counter]:
    wl = Workload(kind="burst", requests=n, spacing_s=0.05, same_prompt=True)
    rep = replay(fleet(), policy, wl.arrivals(0), PromptBook(encode, wl), **kw)
    t0 = min(r.submit_s for r in rep.records)
    assert all(r.error is None and r.output_tokens == 128 for r in rep.records)
    return max(r.token_s[-1] for r in rep.records) - t0, Counter(r.worker for r in rep.records)


def test_an_8_burst_replays_as_the_bench_measured_it():
    """docs/results/cpu-offload, seed-sim (sim workers through real processes, quiet):
    forced GPU 1.273 s, least_loaded 7.773 s with 4 requests on each worker."""
    mk, where = run("forced:gpu-m2")
    assert mk == pytest.approx(1.273, rel=0.01) and where == {"gpu-m2": 8}
    mk, where = run("least_loaded")
    assert mk == pytest.approx(7.773, rel=0.01) and where == {"cpu-m2": 4, "gpu-m2": 4}


def test_a_replay_is_deterministic_and_virtual_time_only():
    assert run("finish_time", 24) == run("finish_time", 24)


def test_a_late_worker_joins_and_takes_work():
    specs = fleet()
    specs[1] = TwinWorkerSpec("gpu-m2", SimProfile.load("gpu-m2"), join_s=0.2)
    wl = Workload(kind="burst", requests=16, spacing_s=0.05, same_prompt=True)
    rep = replay(specs, "finish_time", wl.arrivals(0), PromptBook(encode, wl))
    first = min(r.index for r in rep.records if r.worker == "gpu-m2")
    assert first >= 4  # arrivals 0..4 came before it joined (0.05 s apart)
    assert all(r.error is None for r in rep.records)


def test_stale_heartbeats_still_finish_every_request():
    mk, where = run("phase_cost", 16, links=Links(heartbeat_delay_s=0.5))
    assert sum(where.values()) == 16 and mk > 0


def write_trace(path: Path) -> Path:
    rows = [
        {"timestamp": 1000, "input_length": 1100, "output_length": 40, "hash_ids": [7, 8, 9]},
        {"timestamp": 3000, "input_length": 700, "output_length": 10, "hash_ids": [7, 8]},
        {"timestamp": 3500, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_trace_scaling_keeps_the_shared_blocks(tmp_path):
    path = str(write_trace(tmp_path / "t.jsonl"))
    scale = TraceScale(length_scale=16, time_scale=2)
    reqs = load_trace(path, scale)
    assert [r.offset_s for r in reqs] == [0.0, 1.0, 1.25]  # ms -> s, from the first, / 2
    assert [r.prompt_tokens for r in reqs] == [69, 44, 38]
    a, b, c = (trace_prompt(r, scale, i) for i, r in enumerate(reqs))
    assert len(a) == 69 and a[:44] == b  # blocks 7, 8 (32 tokens each): the same ids
    assert a[:32] != c[:32]  # a different first block shares nothing
    assert len(load_trace(path, TraceScale(limit=2))) == 2
    with pytest.raises(ValueError, match="line 1"):
        (tmp_path / "bad.jsonl").write_text('{"timestamp": 1}\n')
        load_trace(str(tmp_path / "bad.jsonl"), scale)


def test_tandem_sim_writes_a_bench_shaped_result(tmp_path):
    trace = write_trace(tmp_path / "t.jsonl")
    out = tmp_path / "out"
    args = ["sim", "--worker", "sim:cpu-m2", "--worker", "sim:gpu-m2", "--workload", "trace",
            "--trace", str(trace), "--policy", "least_loaded", "--policy", "finish_time",
            "--runs", "1", "--out", str(out)]  # fmt: skip
    res = CliRunner().invoke(main, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    doc = json.loads((out / "result.json").read_text())
    assert doc["complete"] and doc["machine"]["twin"]
    cases = doc["groups"][0]["cases"]
    assert [c["policy"] for c in cases] == ["least_loaded", "finish_time"]
    assert cases[1]["runs"][0]["metrics"]["completed"] == 3
    assert "goodput" in (out / "report.md").read_text()
