"""Routing policies on hand-built states: each phase_cost term, ties, the other policies,
STATE.json parsing and the `tandem route explain` / `tandem decisions` commands."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from tandem.broker.decisions import DecisionLog, decision_record, read_decisions
from tandem.broker.policies import (
    Forced,
    LeastLoaded,
    Load,
    NoCandidate,
    RoundRobin,
    RouteRequest,
    WorkerView,
    parse_policy,
)
from tandem.broker.policies.cost import CacheAware, LeastTokens, PhaseCost, phase_terms
from tandem.broker.policies.state import state_from_json
from tandem.cli.main import main

CPU = dict(prefill_rate=73.0, decode_rates=(45.0, 58.0, 64.0, 68.0))
GPU = dict(prefill_rate=2551.0, decode_rates=(293.0, 533.0, 732.0, 902.0))
ISSUE_STATE = {
    "request": {"prompt_tokens": 516, "max_tokens": 128},
    "workers": [
        {
            "id": "cpu",
            "prefill_rate": 73.0,
            "decode_rate": 45.0,
            "cached_tokens": 496,
            "active": [{"prefill_remaining": 0, "decode_remaining": 100}],
            "queued": [{"prefill_remaining": 20, "decode_remaining": 128}],
        },
        {"id": "gpu", "prefill_rate": 2551.0, "decode_rate": [293, 533, 732, 902]},
    ],
}


def view(
    wid: str, active=(), queued=(), cached: int = 0, max_active: int = 4, device: str = "", **rates
) -> WorkerView:
    return WorkerView(
        id=wid,
        max_active=max_active,
        device=device,
        cached_tokens=cached,
        active=tuple(Load(*x) for x in active),
        queued=tuple(Load(*x) for x in queued),
        **(rates or CPU),
    )


# ------------------------------------------------------------ phase_cost terms
def test_prefill_term_counts_backlog_and_uncached_prompt() -> None:
    w = view("cpu", active=[(30, 10)], queued=[(20, 128)], cached=496)
    t = phase_terms(RouteRequest(516, 128), w)
    assert t.prefill_tokens == 30 + 20 + (516 - 496)


def test_decode_term_counts_unused_budgets_plus_new_budget() -> None:
    w = view("cpu", active=[(0, 100), (0, 7)], queued=[(20, 128)])
    assert phase_terms(RouteRequest(516, 64), w).decode_tokens == 100 + 7 + 128 + 64


def test_fully_cached_prompt_still_costs_one_token() -> None:
    w = view("cpu", cached=600)
    assert phase_terms(RouteRequest(516, 1), w).prefill_tokens == 1


def test_decode_rate_is_taken_at_the_batch_the_new_request_joins() -> None:
    req = RouteRequest(16, 16)
    assert phase_terms(req, view("g", **GPU)).decode_rate == 293.0  # alone: batch 1
    assert phase_terms(req, view("g", active=[(0, 5)] * 2, **GPU)).decode_rate == 732.0
    # Capped by max_active (queued requests wait, they do not widen the batch) ...
    full = view("g", active=[(0, 5)] * 4, queued=[(0, 5)] * 3, **GPU)
    assert phase_terms(req, full).decode_rate == 902.0
    small = view("g", active=[(0, 5)] * 2, max_active=2, **GPU)
    assert phase_terms(req, small).decode_rate == 533.0
    # ... and by the rate table (a plateau past its end).
    short = view("g", active=[(0, 5)] * 3, prefill_rate=100.0, decode_rates=(40.0, 60.0))
    assert phase_terms(req, short).decode_rate == 60.0


def test_issue_example_by_hand() -> None:
    req, views = state_from_json(ISSUE_STATE)
    cpu, gpu = views
    t = phase_terms(req, cpu)
    assert (t.prefill_tokens, t.decode_tokens) == (40, 356)
    assert t.seconds == pytest.approx(40 / 73 + 356 / 45)
    assert phase_terms(req, gpu).seconds == pytest.approx(516 / 2551 + 128 / 293)
    d = PhaseCost().choose(req, views)
    assert d.worker_id == "gpu"
    assert d.scores == {
        "cpu": pytest.approx(8.4591, abs=1e-4),
        "gpu": pytest.approx(0.6392, abs=1e-4),
    }


def test_phase_cost_offloads_when_fast_backlog_outweighs_slow_cost() -> None:
    req = RouteRequest(528, 128)
    cpu = view("cpu", cached=512)  # idle: 16/73 + 128/45 = 3.06 s
    light = view("gpu", cached=512, active=[(0, 128)] * 4, queued=[(16, 128)] * 4, **GPU)
    heavy = view("gpu", cached=512, active=[(0, 128)] * 4, queued=[(16, 128)] * 20, **GPU)
    assert PhaseCost().choose(req, [cpu, light]).worker_id == "gpu"
    assert PhaseCost().choose(req, [cpu, heavy]).worker_id == "cpu"
    # least_tokens ignores the rates: it spreads by tokens whatever the device.
    assert LeastTokens().choose(req, [cpu, light]).worker_id == "cpu"


def test_ties_prefer_fewer_requests_then_worker_id() -> None:
    req = RouteRequest(100, 10)
    # Same seconds (one decode rate at every batch size): b has one request with no
    # work left, a has none.
    flat = dict(prefill_rate=100.0, decode_rates=(50.0,))
    a, b = view("a", **flat), view("b", active=[(0, 0)], **flat)
    assert phase_terms(req, a).seconds == phase_terms(req, b).seconds
    assert PhaseCost().choose(req, [b, a]).worker_id == "a"
    assert PhaseCost().choose(req, [view("z"), view("y")]).worker_id == "y"


# ------------------------------------------------------------ the other policies
def test_least_tokens_scores_p_plus_d() -> None:
    d = LeastTokens().choose(RouteRequest(100, 10), [view("a", queued=[(5, 5)]), view("b")])
    assert d.scores == {"a": 120.0, "b": 110.0} and d.worker_id == "b"


def test_cache_aware_prefers_best_match_when_balanced() -> None:
    req = RouteRequest(100, 10)
    hit, miss = view("hit", cached=80, active=[(0, 1)] * 3), view("miss")
    d = CacheAware().choose(req, [miss, hit])
    assert d.worker_id == "hit"
    assert d.scores["hit"] == pytest.approx(0.2) and d.scores["miss"] == 1.0


def test_cache_aware_falls_back_to_least_loaded() -> None:
    req = RouteRequest(100, 10)
    # Below the threshold (50 % of the prompt): least loaded.
    d = CacheAware().choose(req, [view("hit", cached=48, active=[(0, 1)]), view("idle")])
    assert d.worker_id == "idle"
    # Imbalanced (6 - 0 > 4 and 6 > 1.5 * 0): least loaded despite a full hit.
    busy = view("hit", cached=96, active=[(0, 1)] * 4, queued=[(0, 1)] * 2)
    assert CacheAware().choose(req, [busy, view("idle")]).worker_id == "idle"
    # 5 vs 1 is under the absolute threshold: the cache wins.
    busy = view("hit", cached=96, active=[(0, 1)] * 4, queued=[(0, 1)])
    assert CacheAware().choose(req, [busy, view("idle", active=[(0, 1)])]).worker_id == "hit"


def test_round_robin_cycles_in_id_order() -> None:
    rr, ws = RoundRobin(), [view("b"), view("a"), view("c")]
    picks = [rr.choose(RouteRequest(1, 1), ws).worker_id for _ in range(4)]
    assert picks == ["a", "b", "c", "a"]
    assert rr.choose(RouteRequest(1, 1), ws).scores == {"a": 1.0, "b": 0.0, "c": 1.0}


def test_least_loaded_and_forced() -> None:
    ws = [view("a", active=[(0, 1)]), view("b", active=[(0, 1)] * 2, device="sim-gpu")]
    assert LeastLoaded().choose(RouteRequest(1, 1), ws).worker_id == "a"
    assert Forced("b").choose(RouteRequest(1, 1), ws).worker_id == "b"
    assert Forced("sim-gpu").choose(RouteRequest(1, 1), ws).worker_id == "b"
    with pytest.raises(NoCandidate):
        Forced("tpu").choose(RouteRequest(1, 1), ws)
    assert parse_policy("forced:a").name == "forced:a"
    assert parse_policy("phase_cost").name == "phase_cost"
    with pytest.raises(ValueError):
        parse_policy("fastest")


# ------------------------------------------------------------ STATE.json
def test_state_decode_rate_number_or_list() -> None:
    _, (cpu, gpu) = state_from_json(ISSUE_STATE)
    assert cpu.decode_rates == (45.0,) and cpu.max_active == 4 and cpu.decode_rate(3) == 45.0
    assert gpu.decode_rates == (293.0, 533.0, 732.0, 902.0) and gpu.max_active == 4
    assert cpu.queued == (Load(20, 128),) and gpu.active == ()


@pytest.mark.parametrize(
    "patch, message",
    [
        ({"request": {"max_tokens": 1}}, "prompt_tokens is required"),
        ({"workers": []}, "non-empty list"),
        ({"workers": [{"id": "a", "prefill_rate": 0, "decode_rate": 1}]}, "positive number"),
        ({"workers": [{"id": "a", "prefill_rate": 1, "decode_rate": []}]}, "must not be empty"),
        ({"workers": [{"id": "a", "prefill_rate": 1, "decode_rate": 1}] * 2}, "unique"),
        (
            {
                "workers": [
                    {
                        "id": "a",
                        "prefill_rate": 1,
                        "decode_rate": 1,
                        "active": [{"prefill_remaining": -1}],
                    }
                ]
            },
            "integer >= 0",
        ),
    ],
)
def test_state_errors_name_the_field(patch: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        state_from_json({**ISSUE_STATE, **patch})


# ------------------------------------------------------------ CLI
def test_explain_json_matches_the_policy(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text(json.dumps(ISSUE_STATE))
    result = CliRunner().invoke(
        main, ["route", "explain", str(path), "--json", "--policy", "phase_cost"]
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    req, views = state_from_json(ISSUE_STATE)
    expected = PhaseCost().choose(req, views)
    assert out == {"choice": expected.worker_id, "scores": expected.scores}
    result = CliRunner().invoke(
        main, ["route", "explain", str(path), "--policy", "cache_aware", "--json"]
    )
    assert json.loads(result.stdout)["choice"] == "cpu"  # 496/516 cached


def test_explain_table_and_bad_state(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text(json.dumps(ISSUE_STATE))
    result = CliRunner().invoke(main, ["route", "explain", str(path), "--policy", "phase_cost"])
    assert result.exit_code == 0
    assert "choice gpu" in result.stderr and "*gpu" in result.stderr and "8.46" in result.stderr
    path.write_text('{"request": {"prompt_tokens": 5}}')
    result = CliRunner().invoke(main, ["route", "explain", str(path), "--policy", "phase_cost"])
    assert result.exit_code == 2 and "max_tokens is required" in result.stderr


def test_decision_log_records_and_table(tmp_path: Path) -> None:
    log_path = tmp_path / "decisions.jsonl"
    req, views = state_from_json(ISSUE_STATE)
    log = DecisionLog(str(log_path), time.time)
    log.write(decision_record("r1", "phase_cost", req, views, PhaseCost().choose(req, views)))
    forced = Forced("cpu").choose(req, views)
    log.write(decision_record("r2", "forced:cpu", req, views, forced, {"note": 1}))
    log.close()
    with open(log_path, "a") as f:
        f.write('{"partial": ')  # a log cut mid-line is read up to there
    first, second = read_decisions(log_path)
    assert first["request"] == "r1" and first["choice"] == "gpu" and first["policy"] == "phase_cost"
    cpu = first["candidates"][0]
    assert {k: cpu[k] for k in ("id", "active", "queued", "cached_tokens", "P", "D")} == {
        "id": "cpu", "active": 1, "queued": 1, "cached_tokens": 496, "P": 40, "D": 356,
    }  # fmt: skip
    assert (cpu["prefill_rate"], cpu["decode_rate"]) == (73.0, 45.0)
    assert math.isclose(cpu["score"], 40 / 73 + 356 / 45)
    assert second["choice"] == "cpu" and second["note"] == 1
    assert second["candidates"][1]["score"] is None  # forced: gpu was never a candidate
    result = CliRunner().invoke(main, ["decisions", str(log_path)])
    assert result.exit_code == 0
    lines = result.stderr.splitlines()
    assert lines[0].startswith("2 decision(s)")
    assert any("r1" in x and "phase_cost" in x and "516/128" in x for x in lines)
    assert any(x.split()[0] == "*gpu" for x in lines[2:])
    assert any("cpu" in x and "356" in x and "8.46" in x for x in lines)
    assert any(x.split()[0] == "gpu" and x.split()[-1] == "-" for x in lines[2:])  # no score
    result = CliRunner().invoke(main, ["decisions", str(log_path), "--request", "r2"])
    assert "1 decision(s)" in result.stderr and "*cpu" in result.stderr
