"""A short real ``tandem bench`` run: router + two sim workers as processes, one policy.

Checks what a reader of the results relies on: the JSON, report and plots exist,
every request is accounted for, each produced the tokens asked for, TTFT never
exceeds end-to-end latency, metrics agree with the raw records, and ``tandem
bench report`` re-renders from the JSON alone.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from tandem.broker.policies import DEFAULT_POLICY
from tandem.cli.main import main

N_REQUESTS, N_OUT = 6, 8


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    from tandem.common.model_files import default_model_path

    try:
        default_model_path()  # sim workers take the tokenizer from the default model
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    tmp = tmp_path_factory.mktemp("bench")
    # Fast devices keep the run short: seeding 64 tokens takes ~30 ms on the slow one.
    fast = {"name": "fast", "prefill_tok_s": 20000, "decode_step_s": [0.002, 0.0022]}
    slow = {"name": "slow", "prefill_tok_s": 2000, "decode_step_s": [0.01, 0.014]}
    for doc in (fast, slow):
        (tmp / f"{doc['name']}.json").write_text(json.dumps(doc))
    out = tmp / "out"
    args = ["bench", "--worker", f"sim:{tmp / 'slow.json'}", "--worker", f"sim:{tmp / 'fast.json'}"]
    args += ["--requests", str(N_REQUESTS), "--spacing-ms", "20", "--hit-mix", "0.5"]
    args += ["--prefix-tokens", "64", "--prompt-tokens", "70", "--output-tokens", str(N_OUT)]
    args += ["--policy", "phase_cost+calibrate", "--runs", "1", "--no-progress", "--out", str(out)]
    res = CliRunner().invoke(main, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return out, json.loads((out / "result.json").read_text())


def test_outputs_exist(result: tuple[Path, dict]) -> None:
    out, doc = result
    assert doc["complete"] and doc["command"].startswith("tandem bench")
    assert (out / "report.md").read_text().startswith("# tandem bench")
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert any(p.endswith("-cdf.png") for p in pngs)
    assert any(p.endswith("-phase_cost_calibrate-timeline.png") for p in pngs)
    assert all((out / p).stat().st_size > 1000 for p in pngs)


def test_every_request_is_accounted_for_and_consistent(result: tuple[Path, dict]) -> None:
    _, doc = result
    (group,) = doc["groups"]
    (case,) = group["cases"]
    (run,) = case["runs"]
    recs = run["records"]
    assert sorted(r["index"] for r in recs) == list(range(N_REQUESTS))
    assert sum(r["hit"] for r in recs) == N_REQUESTS // 2
    for r in recs:
        assert r["error"] is None and r["finish_reason"] == "length"
        assert r["output_tokens"] == N_OUT
        assert r["worker"] in ("fast", "slow")
        assert r["submit_s"] <= r["first_token_s"] <= r["last_token_s"] <= r["done_s"]
        assert r["stats"]["cached_tokens"] == (64 if r["hit"] else 0)
    m = run["metrics"]
    assert m["completed"] == N_REQUESTS and m["errors"] == 0
    assert m["ttft_s"]["max"] <= m["e2e_s"]["max"]
    assert m["ttft_s"]["p50"] <= m["e2e_s"]["p50"]
    assert m["makespan_s"] == pytest.approx(max(r["last_token_s"] for r in recs), abs=1e-4)
    assert sum(w["requests"] for w in m["per_worker"].values()) == N_REQUESTS
    assert sum(w["output_tokens"] for w in m["per_worker"].values()) == N_REQUESTS * N_OUT
    # The decision log covers exactly the workload's requests, and agrees on placement.
    chosen = {d["request"]: d["choice"] for d in run["decisions"]}
    assert chosen == {r["request_id"]: r["worker"] for r in recs}
    assert group["cases"][0]["router_policy"] == "phase_cost+calibrate"
    assert all(d["calibrated"] for d in run["decisions"])  # the option reached the router
    # The oracle is a lower bound of the same workload (up to rate-measurement noise).
    assert 0 < run["oracle"]["makespan_s"] <= 1.25 * m["makespan_s"]
    assert sum(run["oracle"]["requests"].values()) == N_REQUESTS
    assert set(group["rates"]["measured"]) == {"fast", "slow"}


def test_report_re_renders_from_the_json(result: tuple[Path, dict], tmp_path: Path) -> None:
    out, _ = result
    res = CliRunner().invoke(
        main, ["bench", "report", str(out / "result.json"), "--out", str(tmp_path)]
    )
    assert res.exit_code == 0, res.output
    text = (tmp_path / "report.md").read_text()
    assert "phase_cost" in text and "oracle" in text
    assert list(tmp_path.glob("*-timeline.png"))


def test_preset_options_and_overrides_map_onto_the_config() -> None:
    from tandem.cli.bench import bench, build_config, command_line

    argv = ["--preset", "seed", "--worker", "llama.cpp:threads=8", "--worker", "mlx:device=gpu"]
    ctx = bench.make_context("bench", [*argv, "--requests", "8"])
    cfg = build_config(ctx, ctx.params)
    assert [w.worker_id for w in cfg.workers] == ["llama", "mlx-gpu"]
    assert [w.label for w in cfg.workloads] == ["burst8-hit100"]  # --requests overrides 8,48
    wl = cfg.workloads[0]
    assert (wl.prefix_tokens, wl.prompt_tokens, wl.output_tokens) == (512, 516, 128)
    assert wl.same_prompt and wl.spacing_s == 0.05 and cfg.runs == 3
    assert cfg.policies == ("forced:@fastest", DEFAULT_POLICY) and cfg.max_active == (4,)
    assert command_line(ctx) == "tandem bench " + " ".join([*argv, "--requests", "8"])
    ctx = bench.make_context(
        "bench", ["--worker", "sim:a.json", "--workload", "poisson", "--hit-mix", "0"]
        + ["--hit-mix", "0.5", "--sweep-max-active", "1,2"]
    )  # fmt: skip
    cfg = build_config(ctx, ctx.params)
    assert [w.label for w in cfg.workloads] == ["poisson1rps-30s-hit0", "poisson1rps-30s-hit50"]
    assert cfg.max_active == (1, 2)


def test_a_sweep_varies_only_the_workers_without_their_own_max_active() -> None:
    from tandem.bench.experiment import Bench
    from tandem.cli.bench import bench, build_config

    argv = ["--worker", "sim:a.json:id=cpu:max_active=4", "--worker", "sim:b.json:id=gpu"]
    ctx = bench.make_context("bench", [*argv, "--sweep-max-active", "1,16"])
    cfg = build_config(ctx, ctx.params)
    b = Bench(cfg, encode=lambda text: [], doc={})
    for swept in (1, 16):
        specs = {s.worker_id: s.args for s in b.specs(cfg.workloads[0], swept)}
        active = {w: int(a[a.index("--max-active") + 1]) for w, a in specs.items()}
        assert active == {"cpu": 4, "gpu": swept}


def test_policy_options_become_router_flags() -> None:
    from tandem.bench.experiment import resolve_policy, router_policy_args

    assert router_policy_args("phase_cost") == ["--policy", "phase_cost"]
    assert router_policy_args("phase_cost+static") == ["--policy", "phase_cost", "--no-calibrate"]
    assert router_policy_args("phase_cost+calibrate+ratio") == [
        "--policy", "phase_cost", "--calibrate", "--decode-estimate", "ratio"
    ]  # fmt: skip
    rates = {"cpu": {"prefill_tok_s": 1e3}, "gpu": {"prefill_tok_s": 1e4}}
    assert resolve_policy("forced:@fastest+calibrate", rates) == "forced:gpu+calibrate"
    with pytest.raises(ValueError, match="unknown option 'fast'"):
        router_policy_args("phase_cost+fast")


def test_a_bench_run_with_a_real_llama_cpp_worker(tmp_path: Path) -> None:
    """The same pipeline end to end on real generation (round_robin: both workers used)."""
    pytest.importorskip("llama_cpp")
    fast = {"name": "fast", "prefill_tok_s": 20000, "decode_step_s": [0.002, 0.0022]}
    (tmp_path / "fast.json").write_text(json.dumps(fast))
    out = tmp_path / "out"
    args = ["bench", "--worker", "llama.cpp:threads=1", "--worker", f"sim:{tmp_path / 'fast.json'}"]
    args += ["--requests", "4", "--spacing-ms", "20", "--prefix-tokens", "32"]
    args += ["--prompt-tokens", "36", "--output-tokens", "4", "--policy", "round_robin"]
    args += ["--runs", "1", "--no-progress", "--out", str(out)]
    res = CliRunner().invoke(main, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    doc = json.loads((out / "result.json").read_text())
    (run,) = doc["groups"][0]["cases"][0]["runs"]
    recs = run["records"]
    assert len(recs) == 4 and all(r["error"] is None and r["output_tokens"] == 4 for r in recs)
    on_llama = [r for r in recs if r["worker"] == "llama"]
    assert len(on_llama) == 2, [r["worker"] for r in recs]
    assert all(r["stats"]["cached_tokens"] == 32 for r in on_llama), "the seeded prefix was reused"
    assert (out / "report.md").exists()


def test_reused_workers_serve_every_run_behind_a_fresh_router_per_policy(tmp_path: Path) -> None:
    """--reuse-workers: each run's router has the run's policy; the workers keep what
    they measured (their step samples only grow); every run carries the rates the
    router priced with at its end and the oracle bound under them."""
    fast = {"name": "fast", "prefill_tok_s": 20000, "decode_step_s": [0.002, 0.0022]}
    slow = {"name": "slow", "prefill_tok_s": 4000, "decode_step_s": [0.004, 0.005]}
    for doc in (fast, slow):
        (tmp_path / f"{doc['name']}.json").write_text(json.dumps(doc))
    out = tmp_path / "out"
    args = ["bench", "--worker", f"sim:{tmp_path / 'slow.json'}"]
    args += ["--worker", f"sim:{tmp_path / 'fast.json'}", "--reuse-workers"]
    args += ["--requests", "4", "--spacing-ms", "10", "--prefix-tokens", "32"]
    args += ["--prompt-tokens", "36", "--output-tokens", "6", "--policy", "forced:fast"]
    args += ["--policy", "round_robin", "--runs", "2", "--rates", "advertised"]
    args += ["--no-progress", "--out", str(out)]
    res = CliRunner().invoke(main, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    doc = json.loads((out / "result.json").read_text())
    assert doc["config"]["reuse_workers"]
    forced, rr = doc["groups"][0]["cases"]
    assert all({r["worker"] for r in run["records"]} == {"fast"} for run in forced["runs"])
    for run in rr["runs"]:
        assert sorted(r["worker"] for r in run["records"]) == ["fast", "fast", "slow", "slow"]
    # Interleaved, rotated rounds (forced, rr; rr, forced) on the same workers: fast's
    # samples grow in the order the runs ran. (On a noisy machine the CV rule may add
    # rounds after these two: they rotate too and keep the samples growing.)
    order = sorted([*forced["runs"], *rr["runs"]], key=lambda r: (r["run"], r["position"]))
    first_rounds = [r for r in order if r["run"] < 2]
    assert first_rounds == [forced["runs"][0], rr["runs"][0], rr["runs"][1], forced["runs"][1]]
    seen = [sum(run["served_rates"]["fast"]["live_decode_samples"]) for run in order]
    assert seen == sorted(seen) and seen[-1] > seen[0], seen
    for run in order:
        assert set(run["served_rates"]) == {"fast", "slow"}
        assert 0 < run["oracle_served"]["makespan_s"] <= 1.25 * run["metrics"]["makespan_s"]
    report = (out / "report.md").read_text()
    assert "a fresh router" in report and "served (median of runs)" in report
    # The twin's oracle over the served rates: every run, one best per arrival schedule.
    res = CliRunner().invoke(main, ["bench", "twin-oracle", str(out / "result.json")])
    assert res.exit_code == 0, res.output
    doc = json.loads((out / "result.json").read_text())
    runs = [r for c in doc["groups"][0]["cases"] for r in c["runs"]]
    assert all(r["twin_oracle"]["exact"] for r in runs)  # 2 workers ** 4 requests: all tried
    for index in (0, 1):
        same = [r["twin_oracle"] for r in runs if r["run"] == index]
        assert len({t["makespan_s"] for t in same}) == 1
        assert all(t["own_makespan_s"] >= t["makespan_s"] for t in same)
    assert "Twin oracle" in (out / "report.md").read_text()


def test_merge_joins_runs_of_the_same_case_and_keeps_every_command(
    result: tuple[Path, dict], tmp_path: Path
) -> None:
    from tandem.bench.merge import merge_results

    out, doc = result
    other = json.loads(json.dumps(doc))
    other["command"] += " --again"
    other["groups"][0]["label"] = "another-group"
    merged = merge_results([doc, doc, other])
    by_label = {g["label"]: g for g in merged["groups"]}
    assert set(by_label) == {doc["groups"][0]["label"], "another-group"}
    (case,) = by_label[doc["groups"][0]["label"]]["cases"]
    assert [r["run"] for r in case["runs"]] == [0, 1]
    assert case["summary"]["makespan_s"]["n"] == 2
    assert [m["command"] for m in merged["merged_from"]][-1].endswith("--again")
    assert merge_results([doc], policies=("forced:cpu",))["groups"] == []
    stranger = json.loads(json.dumps(doc))
    stranger["config"]["workers"][0]["id"] = "elsewhere"
    with pytest.raises(ValueError, match="different workers"):
        merge_results([doc, stranger])
    res = CliRunner().invoke(
        main, ["bench", "merge", str(out / "result.json"), str(out / "result.json"), "--out",
               str(tmp_path)]
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "Merged from 2 bench invocations" in (tmp_path / "report.md").read_text()
