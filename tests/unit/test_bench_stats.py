"""The bench harness's pure parts on constructed data: statistics, CV rule, oracle bound,
worker specs, workloads."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from tandem.bench import stats
from tandem.bench.driver import RequestRecord
from tandem.bench.oracle import Job, WorkerRates, assignment_bound, job_costs, oracle_bound
from tandem.bench.spec import parse_workers
from tandem.bench.workload import PromptBook, Workload


# ------------------------------------------------------------ statistics
@pytest.mark.parametrize("q", [0, 10, 50, 90, 95, 99, 100])
def test_percentile_matches_numpy_linear(q: float) -> None:
    rng = random.Random(1)
    xs = [rng.expovariate(1.0) for _ in range(37)]
    assert stats.percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))


def test_percentile_edges() -> None:
    assert stats.percentile([3.0], 99) == 3.0
    assert stats.percentile([1.0, 2.0], 50) == 1.5
    with pytest.raises(ValueError):
        stats.percentile([], 50)
    with pytest.raises(ValueError):
        stats.percentile([1.0], 101)


def test_mean_std_is_the_sample_std_and_cv() -> None:
    mean, std = stats.mean_std([10.0, 12.0, 14.0])
    assert (mean, std) == (12.0, pytest.approx(2.0))
    assert stats.cv([10.0, 12.0, 14.0]) == pytest.approx(2.0 / 12.0)
    assert stats.mean_std([5.0]) == (5.0, 0.0)


def _run(makespan: float, tok_s: float) -> dict:
    return {"metrics": {"makespan_s": makespan, "output_tok_s": tok_s}}


def test_cv_rule_adds_runs_only_above_five_percent() -> None:
    steady = [_run(10.0, 100.0), _run(10.2, 99.0), _run(9.9, 101.0)]
    assert not stats.needs_more_runs(steady)
    noisy_makespan = [_run(10.0, 100.0), _run(11.5, 100.0), _run(9.0, 100.0)]
    assert stats.needs_more_runs(noisy_makespan)
    noisy_tput = [_run(10.0, 100.0), _run(10.0, 120.0), _run(10.0, 90.0)]
    assert stats.needs_more_runs(noisy_tput)
    assert not stats.needs_more_runs([_run(10.0, 100.0)])  # one run: no spread to judge


def _rec(i: int, worker: str, submit: float, tokens: list[float], **kw: object) -> RequestRecord:
    r = RequestRecord(
        i, f"r{i}", True, submit, submit, list(tokens), tokens[-1] if tokens else None
    )
    r.worker, r.output_tokens = worker, len(tokens)
    r.stats = {"queue_s": 0.5 * i}
    for k, v in kw.items():
        setattr(r, k, v)
    return r


def test_run_metrics_on_constructed_records() -> None:
    recs = [
        _rec(0, "gpu", 100.0, [100.5, 100.6, 100.8]),
        _rec(1, "gpu", 100.1, [101.1, 101.2, 101.3]),
        _rec(2, "cpu", 100.2, [100.7, 101.7, 104.0]),
        _rec(3, "cpu", 100.3, [], error="worker_lost: gone"),
    ]
    m = stats.run_metrics(recs, ["cpu", "gpu"])
    assert m["requests"] == 4 and m["completed"] == 3 and m["errors"] == 1
    assert m["makespan_s"] == pytest.approx(4.0)  # first submit 100.0 -> last token 104.0
    assert m["output_tok_s"] == pytest.approx(9 / 4.0)
    assert m["ttft_s"]["p50"] == pytest.approx(0.5)  # TTFTs 0.5, 1.0, 0.5
    assert m["e2e_s"]["max"] == pytest.approx(3.8)
    gaps = [0.1, 0.2, 0.1, 0.1, 1.0, 2.3]
    assert m["itl_s"]["p50"] == pytest.approx(float(np.percentile(gaps, 50)))
    assert m["itl_s"]["p99"] == pytest.approx(float(np.percentile(gaps, 99)))
    assert m["per_worker"] == {
        "cpu": {"requests": 1, "output_tokens": 3},
        "gpu": {"requests": 2, "output_tokens": 6},
    }


def test_summarize_runs_gives_mean_std_over_runs() -> None:
    runs = [
        {**_run(10.0, 100.0), "oracle": {"makespan_s": 8.0}},
        {**_run(12.0, 90.0), "oracle": {"makespan_s": 8.0}},
    ]
    s = stats.summarize_runs(runs)
    assert s["makespan_s"]["mean"] == 11.0
    assert s["makespan_s"]["std"] == pytest.approx(np.std([10.0, 12.0], ddof=1))
    assert s["vs_oracle"]["mean"] == pytest.approx((10 / 8 + 12 / 8) / 2)
    assert "vs_oracle_served" not in s  # no run had served rates
    runs[0]["oracle_served"] = runs[1]["oracle_served"] = {"makespan_s": 10.0}
    assert stats.summarize_runs(runs)["vs_oracle_served"]["mean"] == pytest.approx(1.1)


# ------------------------------------------------------------ oracle bound
GPU = WorkerRates(prefill_tok_s=2000.0, decode_tok_s_1=100.0, decode_tok_s_peak=400.0)
CPU = WorkerRates(prefill_tok_s=100.0, decode_tok_s_1=40.0, decode_tok_s_peak=60.0)


def test_single_worker_bound_is_work_or_latency() -> None:
    # 4 jobs at t=0, 101 output tokens: work 4 x (0.0005 + 100/400) = 1.002 s;
    # one job's latency 0.0005 + 100/100 = 1.0005 s: work dominates.
    jobs = [Job(0.0, 1, 101) for _ in range(4)]
    r = oracle_bound(jobs, {"gpu": GPU})
    assert r.makespan_s == pytest.approx(1.002, abs=2e-3)
    assert r.requests == {"gpu": 4}
    # A lone job: its own latency is the bound.
    assert oracle_bound([Job(0.0, 1, 101)], {"gpu": GPU}).makespan_s == pytest.approx(
        1.0005, abs=2e-3
    )


def test_late_arrivals_count_from_their_arrival() -> None:
    jobs = [Job(0.0, 1, 101), Job(5.0, 1, 101)]
    r = oracle_bound(jobs, {"gpu": GPU})
    assert r.makespan_s == pytest.approx(5.0 + 1.0005, abs=2e-3)


def test_two_equal_workers_split_the_work() -> None:
    jobs = [Job(0.0, 1, 101) for _ in range(8)]
    r = oracle_bound(jobs, {"a": GPU, "b": GPU})
    assert r.requests == {"a": 4, "b": 4}
    assert r.makespan_s == pytest.approx(1.002, abs=2e-3)


def test_slow_worker_gets_work_only_when_it_helps() -> None:
    few = [Job(0.05 * i, 4, 128) for i in range(2)]
    assert oracle_bound(few, {"gpu": GPU, "cpu": CPU}).requests["cpu"] == 0
    many = [Job(0.05 * i, 4, 128) for i in range(24)]
    assert oracle_bound(many, {"gpu": GPU, "cpu": CPU}).requests["cpu"] > 0


def test_a_few_requests_bound_a_worker_at_the_batch_they_can_fill() -> None:
    """Rates by batch size: N requests never decode more than N rows at once, so the
    peak is read at batch min(N, max_active); without a table, the given peak."""
    from tandem.bench.calibrate import served_rates, to_worker_rates

    decode = [100, 180, 250, 300, 350, 400, 450, 500]
    row = {"id": "gpu", "priced_prefill_tok_s": 2e4, "priced_decode_tok_s": decode}
    row |= {"live_decode_tok_s": [None] * 8, "live_decode_samples": [0] * 8}
    rates = served_rates([row])
    assert rates["gpu"]["source"] == "served" and rates["gpu"]["decode_tok_s_peak"] == 500
    assert to_worker_rates(rates)["gpu"].decode_tok_s_peak == 500
    assert to_worker_rates(rates, jobs=3)["gpu"].decode_tok_s_peak == 250
    assert to_worker_rates(rates, jobs=48)["gpu"].decode_tok_s_peak == 500
    measured = {"prefill_tok_s": 1e3, "decode_tok_s_1": 50, "decode_tok_s_peak": 90}
    assert to_worker_rates({"cpu": measured}, jobs=1)["cpu"].decode_tok_s_peak == 90
    # Tighter, still a bound: 3 jobs of 101 tokens on batch <= 3 cannot beat 300/250 s.
    jobs = [Job(0.0, 1, 101) for _ in range(3)]
    assert oracle_bound(jobs, to_worker_rates(rates, jobs=3)).makespan_s == pytest.approx(
        300 / 250 + 3 / 2e4, abs=2e-3
    )


def _brute_force(jobs: list[Job], workers: dict[str, WorkerRates]) -> float:
    ids = sorted(workers)
    order = sorted(jobs, key=lambda j: j.arrival_s)
    t0 = order[0].arrival_s
    best = float("inf")
    for pick in itertools.product(range(len(ids)), repeat=len(order)):
        finish = 0.0
        for w, wid in enumerate(ids):
            mine = [j for j, p in zip(order, pick, strict=True) if p == w]
            arr = [j.arrival_s - t0 for j in mine]
            finish = max(finish, assignment_bound(arr, [job_costs(j, workers[wid]) for j in mine]))
        best = min(best, finish)
    return best


@pytest.mark.parametrize("seed", range(6))
def test_oracle_equals_brute_force_on_small_instances(seed: int) -> None:
    rng = random.Random(seed)
    jobs = [Job(rng.uniform(0, 3), rng.choice([4, 300]), rng.choice([16, 128])) for _ in range(7)]
    workers = {"gpu": GPU, "cpu": CPU} if seed % 2 else {"gpu": GPU, "cpu": CPU, "cpu2": CPU}
    r = oracle_bound(jobs, workers, tol_s=1e-4)
    assert r.makespan_s == pytest.approx(_brute_force(jobs, workers), abs=2e-3)
    assert sum(r.requests.values()) == len(jobs)


# ------------------------------------------------------------ specs and workloads
def test_worker_specs_map_items_to_flags_and_ids() -> None:
    a, b, c, d = parse_workers(
        [
            "llama.cpp:threads=8",
            "mlx:device=gpu",
            "sim:gpu-m2:decode_tok_s=1,2,3:max_active=8",
            "sim:x/cpu.json:id=slow",
        ]
    )
    assert (a.worker_id, a.backend, a.flags) == ("llama", "llama.cpp", ("--threads", "8"))
    assert (b.worker_id, b.flags) == ("mlx-gpu", ("--device", "gpu"))
    assert c.worker_id == "gpu-m2" and c.max_active == 8
    assert c.flags == ("--decode-tok-s", "1,2,3", "--profile", "gpu-m2")
    assert d.worker_id == "slow"
    args = c.cluster_spec(4, 8192, 0.5).args
    assert args[:2] == ["--backend", "sim"] and args[-6:-2] == [
        "--max-active",
        "4",
        "--n-ctx",
        "8192",
    ]


@pytest.mark.parametrize("bad", ["cuda:x=1", "sim:a.json:b.json", "sim:threads=", "sim:=3"])
def test_bad_worker_specs_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_workers([bad])


def test_default_ids_stay_unique() -> None:
    ids = [w.worker_id for w in parse_workers(["llama.cpp", "llama.cpp:threads=1"])]
    assert ids == ["llama", "llama-2"]


def test_workload_schedules() -> None:
    burst = Workload(kind="burst", requests=48, spacing_s=0.05, hit_fraction=0.5).arrivals(0)
    assert [a.offset_s for a in burst[:3]] == pytest.approx([0.0, 0.05, 0.1])
    assert sum(a.hit for a in burst) == 24
    onoff = Workload(kind="onoff", requests=4, spacing_s=0.1, bursts=3, gap_s=5.0).arrivals(0)
    assert [round(a.offset_s, 3) for a in onoff[3:6]] == [0.3, 5.3, 5.4]
    pois = Workload(kind="poisson", rate_rps=4.0, duration_s=50.0)
    first, again = pois.arrivals(1), pois.arrivals(1)
    assert first == again and 150 < len(first) < 250  # deterministic, ~rate x duration
    assert all(0 <= a.offset_s < 50.0 for a in first)


def test_prompts_have_exact_lengths_and_share_only_the_prefix() -> None:
    wl = Workload(prefix_tokens=64, prompt_tokens=70, hit_fraction=0.5)
    book = PromptBook(lambda text: [ord(c) for c in text], wl)
    arrivals = wl.arrivals(0)
    prompts = [book.prompt(a) for a in arrivals]
    assert all(len(p) == 70 for p in prompts)
    hits = [p for a, p in zip(arrivals, prompts, strict=True) if a.hit]
    misses = [p for a, p in zip(arrivals, prompts, strict=True) if not a.hit]
    assert all(p[:64] == book.prefix for p in hits)
    assert len({tuple(p[64:]) for p in hits}) == len(hits)  # distinct tails
    assert len({tuple(p[:16]) for p in misses}) == len(misses)  # no shared first block
    same = PromptBook(lambda text: [ord(c) for c in text], Workload(same_prompt=True))
    a0, a1 = Workload().arrivals(0)[:2]
    assert same.prompt(a0) == same.prompt(a1)


def test_workload_validation() -> None:
    with pytest.raises(ValueError):
        Workload(kind="spiky")
    with pytest.raises(ValueError):
        Workload(prefix_tokens=516, prompt_tokens=516)
    with pytest.raises(ValueError):
        Workload(hit_fraction=1.5)


# ------------------------------------------------------------ run order
def test_rounds_rotate_so_every_policy_runs_once_in_every_place() -> None:
    from tandem.bench.run import rotated

    policies = ("forced:gpu", "least_loaded", "lookahead")
    rounds = [rotated(policies, r) for r in range(len(policies))]
    assert rounds[0] == list(policies)
    for r in rounds:
        assert sorted(r) == sorted(policies)
    for place in range(len(policies)):
        assert {r[place] for r in rounds} == set(policies)
    assert rotated(policies, 3) == rounds[0] and rotated([], 5) == []


def test_a_group_runs_its_rounds_rotated_and_records_each_runs_place(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from types import SimpleNamespace

    import tandem.bench.run as run_mod

    calls: list[tuple[str, int]] = []

    def run_once(wl, max_active, policy, run, rates):  # noqa: ANN001, ANN202
        calls.append((policy, run))
        return {"run": run, "metrics": {"makespan_s": 1.0, "ttft_s": {"mean": 0.1},
                                        "e2e_s": {"mean": 0.5}}}  # fmt: skip

    cfg = SimpleNamespace(policies=("round_robin", "least_loaded"), runs=3)
    bench = SimpleNamespace(cfg=cfg, doc={"groups": []}, run_once=run_once,
                            calibrate=lambda wl, a: {"used": {}})  # fmt: skip
    bar = SimpleNamespace(set_description=lambda *a: None, update=lambda: None,
                          set_postfix=lambda **k: None, refresh=lambda: None, total=0)  # fmt: skip
    monkeypatch.setattr(run_mod, "save", lambda doc, out: None)
    group = run_mod._run_cases(bench, Workload(kind="burst", requests=2), 4, bar, None)
    assert calls == [("round_robin", 0), ("least_loaded", 0), ("least_loaded", 1),
                     ("round_robin", 1), ("round_robin", 2), ("least_loaded", 2)]  # fmt: skip
    rr = next(c for c in group["cases"] if c["policy"] == "round_robin")
    assert [r["position"] for r in rr["runs"]] == [0, 1, 0]
