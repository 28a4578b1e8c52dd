"""The simulated device and phase-aware routing over real processes.

Unit part: SimProfile, SimBackend driven by the real Engine (simulated time is
checked through ``busy_s``, not wall clocks), ``tandem profile`` on a sim.
Integration part: a ``tandem router`` and two sim workers, a fast (GPU) and a slow
(CPU) device, as subprocesses on ipc:// sockets; a burst 50 ms apart goes to the
fast device first and starts offloading to the slow one once the fast one's
backlog outweighs the slow one's cost.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tandem.cli.main import main
from tandem.common import protocol as p
from tandem.common.protocol import SamplingParams
from tandem.launcher.cluster import Cluster, WorkerSpec
from tandem.workers.backends.sim import SimBackend
from tandem.workers.device_model import BUNDLED_PROFILES, SimProfile
from tandem.workers.engine import Engine, EngineConfig
from tandem.workers.request import Request
from tests.helpers import wait_for

GPU_PROFILE = BUNDLED_PROFILES / "gpu-m2.json"
CPU_PROFILE = BUNDLED_PROFILES / "cpu-m2.json"


@pytest.fixture(scope="module")
def model() -> Path:
    from tandem.common.model_files import default_model_path

    try:
        return default_model_path()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))


def write_profile(tmp_path: Path, **fields: Any) -> Path:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"name": "t", "prefill_tok_s": 5000, **fields}))
    return path


# ------------------------------------------------------------ the profile
def test_profile_files_and_costs() -> None:
    gpu, cpu = SimProfile.load(GPU_PROFILE), SimProfile.load(CPU_PROFILE)
    assert (gpu.prefill_tok_s, cpu.prefill_tok_s) == (2551, 73)
    assert gpu.decode_tok_s()[0] == pytest.approx(293, rel=1e-3)
    assert cpu.decode_tok_s()[0] == pytest.approx(45, rel=1e-3)
    assert cpu.cost_s(73, 0) == pytest.approx(1.0)
    assert cpu.cost_s(73, 2) == pytest.approx(1.0 + cpu.decode_step_s[1])
    n = len(gpu.decode_step_s)
    # Past the table the aggregate decode rate plateaus.
    assert 2 * n / gpu.step_s(2 * n) == pytest.approx(gpu.decode_tok_s()[-1])
    assert cpu.decode_context_s == 0.0  # a profile without the key: no context cost


def test_a_profile_with_a_context_slope_charges_the_decode_rows_context(tmp_path: Path) -> None:
    prof = SimProfile.load(
        write_profile(tmp_path, decode_step_s=[0.01, 0.015], decode_context_s=2e-6)
    )
    assert prof.decode_context_s == 2e-6
    # Two rows attending over 1,000 and 3,000 tokens: 4,000 * 2 us on top of the batch-2 step.
    assert prof.cost_s(100, 2, 4000) == pytest.approx(100 / 5000 + 0.015 + 0.008)
    assert prof.cost_s(100, 0) == pytest.approx(100 / 5000)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"decode_step_s": []}, "positive seconds"),
        ({"decode_step_s": [0.01, 0]}, "positive seconds"),
        ({"decode_step_s": 0.01, "prefill_tok_s": -1}, "prefill_tok_s"),
        ({"decode_step_s": 0.01, "speed": 1}, "unknown key"),
        ({"decode_step_s": 0.01, "decode_context_s": -1e-6}, "decode_context_s"),
    ],
)
def test_bad_profiles_are_refused(tmp_path: Path, fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SimProfile.load(write_profile(tmp_path, **fields))


# ------------------------------------------------------------ the backend under the engine
def run_engine(engine: Engine, *requests: Request) -> list[p.Message]:
    out: list[p.Message] = []
    engine.emit = out.append
    for r in requests:
        engine.submit(r)
    while engine.queue or engine.active:
        engine.step()
    return out


def sim_engine(sim: SimBackend, **cfg: Any) -> Engine:
    return Engine(sim, EngineConfig(**cfg), lambda m: None, "sim-test")


def test_sim_sleeps_by_profile_and_cache_hits_shorten_prefill(tmp_path: Path, model: Path) -> None:
    sim = SimBackend(write_profile(tmp_path, decode_step_s=[0.001, 0.0015]), 4096, model)
    assert sim.name == "sim" and sim.device == "sim-t" and sim.model_name == model.name
    assert sim.profile_rates == (5000, [1000.0, pytest.approx(2000 / 1.5)])
    engine = sim_engine(sim, max_active=2, step_tokens=256)
    prefix = list(range(1000, 1512))
    t0 = time.monotonic()
    run_engine(engine, Request("seed", prefix, SamplingParams(max_tokens=1, prefill_only=True)))
    assert sim.busy_s == pytest.approx(512 / 5000)  # two 256-token chunks, no decode
    assert time.monotonic() - t0 >= 0.09  # it really slept (minus the host's own time)
    # Shares the 512-token prefix: only 16 tokens to prefill, then 4 decode steps (batch 1).
    sim.busy_s = 0.0
    out = run_engine(engine, Request("r", prefix + list(range(16)), SamplingParams(max_tokens=5)))
    assert sim.busy_s == pytest.approx(16 / 5000 + 4 * 0.001)
    done = [m for m in out if isinstance(m, p.Done)]
    assert done[0].stats.cached_tokens == 512 and done[0].stats.output_tokens == 5


def test_sim_tokens_are_deterministic_and_never_end_generation(tmp_path: Path, model: Path) -> None:
    sim = SimBackend(write_profile(tmp_path, decode_step_s=0.0001), 4096, model)

    def tokens(prompt: list[int], rid: str) -> list[int]:
        out = run_engine(
            sim_engine(sim, cache_tokens=0), Request(rid, prompt, SamplingParams(max_tokens=40))
        )
        return [t for m in out if isinstance(m, p.TokenDelta) for t in m.token_ids]

    a, b = tokens([5, 6, 7], "a"), tokens([5, 6, 7], "b")
    assert a == b and len(a) == 40 and len(set(a)) > 30
    assert tokens([5, 6, 8], "c") != a
    assert not any(sim.is_eog(t) for t in a) and all(sim.piece(t) for t in a)


def test_profile_command_measures_a_sim(tmp_path: Path, model: Path, monkeypatch) -> None:
    monkeypatch.setenv("TANDEM_CACHE_DIR", str(tmp_path / "cache"))
    path = write_profile(tmp_path, decode_step_s=[0.004, 0.005])
    args = ["profile", "--backend", "sim", "--profile", str(path), "--max-active", "2"]
    args += ["--decode-tokens", "16", "--repeats", "3", "--json"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["simulated"] and doc["device"] == "sim-t" and doc["prompt_tokens"] == 512
    assert doc["decode_context"] == 512  # decode is measured after prompts as long as served
    # The engine adds a little overhead to the played-back step times.
    assert doc["prefill_tok_s"] == pytest.approx(5000, rel=0.2)
    assert doc["decode_tok_s"] == pytest.approx([250, 400], rel=0.2)
    saved = json.loads(Path(doc["path"]).read_text())
    assert saved["decode_tok_s"] == doc["decode_tok_s"] and str(tmp_path) in doc["path"]
    small = CliRunner().invoke(main, [*args, "--n-ctx", "600"])
    assert small.exit_code == 2 and "KV cells" in small.output  # 2 x (512 + 19) > 600


# ------------------------------------------------------------ real processes
@pytest.fixture
def sim_cluster(tmp_path: Path, model: Path) -> Iterator[tuple[Cluster, Path]]:
    """A router with a decision log and two sim workers: gpu (gpu-m2) and cpu (cpu-m2)."""
    log = tmp_path / "decisions.jsonl"
    workers = [
        WorkerSpec(wid, ["--backend", "sim", "--profile", str(prof), "--max-active", "4"])
        for wid, prof in (("gpu", GPU_PROFILE), ("cpu", CPU_PROFILE))
    ]
    # Static prices and phase_cost: the test checks scores against the profiles' own
    # numbers through phase_cost's formula.
    router = ["--decision-log", str(log), "--no-calibrate", "--policy", "phase_cost"]
    with Cluster(workers, router, log_dir=tmp_path) as c:
        yield c, log


PREFIX = [1000 + (i * 37) % 20000 for i in range(512)]
# The burst brings 20 x 128 = 2560 decode tok/s; the fast device drains at most 902
# (its batch-4 rate), so its backlog passes the idle slow device's 3.06 s by request
# ~32 even if it runs exactly at its profile. 40 requests leave some margin.
BURST = 40


def test_burst_goes_fast_first_then_offloads_to_slow(sim_cluster: tuple[Cluster, Path]) -> None:
    cluster, log = sim_cluster
    with cluster.client(timeout_s=60.0) as c:
        seeds = [c.stream(tokens=PREFIX, prefill_only=True, worker=w) for w in ("gpu", "cpu")]
        for s in seeds:
            list(s)
            assert s.result.finish_reason == "prefill_only"
        wait_for(c, lambda ws: all(w["cached_blocks"] >= len(PREFIX) // 16 for w in ws))
        streams, t0 = [], time.monotonic()
        for i in range(BURST):
            time.sleep(max(0.0, t0 + 0.05 * i - time.monotonic()))
            tokens = PREFIX + [30000 + 16 * i + k for k in range(16)]
            streams.append(
                c.stream(tokens=tokens, max_tokens=128, ignore_eos=True, request_id=f"b{i:02d}")
            )
        results = {s.request_id: (list(s), s.result)[1] for s in streams}
    for r in results.values():
        assert r.finish_reason == "length" and len(r.token_ids) == 128
        assert r.stats["cached_tokens"] == 512 and r.stats["router_cached_estimate"] == 512

    records = [json.loads(x) for x in log.read_text().splitlines()]
    assert [r["policy"] for r in records[:2]] == ["forced:gpu", "forced:cpu"]
    burst = records[2:]
    assert [r["request"] for r in burst] == [f"b{i:02d}" for i in range(BURST)]
    for r in burst:
        by_id = {c["id"]: c for c in r["candidates"]}
        assert r["choice"] == results[r["request"]].worker  # the log tells what happened
        for c in by_id.values():
            assert c["cached_tokens"] == 512
            # Every request on a worker is priced at its 16 uncached tokens (queued ones
            # keep their routing-time estimate), never at the full 528.
            assert 16 * (c["queued"] + 1) <= c["P"] <= 16 * (c["active"] + c["queued"] + 1)
        assert r["choice"] == min(by_id, key=lambda w: by_id[w]["score"])
    choices = [r["choice"] for r in burst]
    assert choices[:5] == ["gpu"] * 5
    # Whether (and when) the fast device's backlog outweighs the idle slow one depends on
    # how fast it drains in wall time, which a loaded machine changes: the ledger unit
    # tests (tests/unit/test_ledger.py) pin the offload itself without a clock. Here:
    # every choice above was the cheapest logged score, and the first offload, if any,
    # priced the idle slow device at the new request alone.
    if "cpu" in choices:
        first = burst[choices.index("cpu")]
        cpu, gpu = (next(c for c in first["candidates"] if c["id"] == w) for w in ("cpu", "gpu"))
        assert (cpu["active"], cpu["queued"], cpu["P"], cpu["D"]) == (0, 0, 16, 128)
        assert cpu["score"] == pytest.approx(16 / 73 + 128 / 45, rel=1e-4)  # 45.0005: rounding
        assert gpu["score"] > cpu["score"] and gpu["D"] > 128


def test_the_step_gap_tool_measures_both_patterns_at_the_devices_speed(
    tmp_path: Path, model: Path
) -> None:
    """studies/step_gap.py: aligned and churning batches both decode at the device's
    step time (a sim device does not care about the pattern), and only the churn
    admits and finishes requests while the batch is full."""
    from studies.step_gap import run_mode

    sim = SimBackend(write_profile(tmp_path, decode_step_s=[0.002, 0.003, 0.004]), 16384, model)
    aligned = run_mode(sim, "aligned", 3, 24)
    churn = run_mode(sim, "churn", 3, 24)
    assert aligned["steps_at_batch"] >= 20 and churn["steps_at_batch"] >= 40
    for row in (aligned, churn):
        assert row["median_ms"] == pytest.approx(4.0, rel=0.25), row
        assert row["priced_ms"] == pytest.approx(4.0, rel=0.25), row  # the router's estimate
        assert row["mean_ms"] >= row["priced_ms"], row  # clipped: never above the mean
    assert churn["request_host_s"] > 0
