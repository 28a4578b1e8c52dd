"""Which engine serve puts on each GPU: the fastest by stored profiles, the measured
prior (llama.cpp on CUDA) where a profile is missing, ``--engine`` over both; shown
in the plan and recorded in the run folder. Devices and measurements are faked."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tandem.cli.serve import serve
from tandem.launcher import devices as dev
from tandem.launcher import engines
from tests.unit.test_serve_plan import dry_run, flag

CUDA_BOTH = dev.Machine("Linux", "x86_64", cores=16, mlx_cuda=True, llama_gpu=True, cuda_gpus=1)
MAC_BOTH = dev.Machine("Darwin", "arm64", cores=10, mlx_metal=True, llama_gpu=True)
MODEL = "SmolLM2-135M-Instruct.Q4_1.gguf"
# The H200's shapes: llama.cpp 3-4x MLX at batch 1, both scaling with the batch.
LLAMA = (20_000.0, [500.0, 900.0, 1_500.0, 2_100.0])
MLX = (30_000.0, [150.0, 280.0, 500.0, 700.0])


def lookup(table):  # type: ignore[no-untyped-def]
    return lambda engine, device, model: table.get((engine, device, model))


def gpu(machine: dev.Machine) -> dev.Device:
    return dev.devices(machine)[1]


def test_the_faster_engine_by_stored_profiles_wins_whatever_the_prior():
    d = gpu(MAC_BOTH)  # prior: MLX first on Apple silicon
    both = {("mlx", "gpu-metal", MODEL): MLX, ("llama.cpp", "gpu-metal", MODEL): LLAMA}
    got = engines.choose(d, MODEL, 4, lookup(both))
    assert got.engine == "llama.cpp" and "fastest by the stored profiles" in got.why
    assert got.scores["llama.cpp"] > got.scores["mlx"] > 0
    # Measured the other way round, the other wins: the choice follows the numbers.
    slow_llama = (LLAMA[0], [x / 10 for x in LLAMA[1]])
    measured = {("mlx", "gpu-cuda", MODEL): MLX, ("llama.cpp", "gpu-cuda", MODEL): slow_llama}
    got = engines.choose(gpu(CUDA_BOTH), MODEL, 4, lookup(measured))
    assert got.engine == "mlx"


def test_a_missing_profile_leaves_the_prior_and_says_how_to_measure():
    only_mlx = lookup({("mlx", "gpu-cuda", MODEL): MLX})
    got = engines.choose(gpu(CUDA_BOTH), MODEL, 16, only_mlx)
    assert got.engine == "llama.cpp"  # the H200's measurement: llama.cpp first on CUDA
    assert "tandem profile --backend llama.cpp --device gpu" in got.why
    assert engines.choose(gpu(MAC_BOTH), MODEL, 16, lookup({})).engine == "mlx"
    # Profiles of another model say nothing about this one.
    other = lookup({(e, "gpu-cuda", "other.gguf"): MLX for e in ("mlx", "llama.cpp")})
    assert engines.choose(gpu(CUDA_BOTH), MODEL, 16, other).scores == {}


def test_engine_flag_overrides_and_is_refused_where_not_installed():
    both = lookup({("mlx", "gpu-cuda", MODEL): MLX, ("llama.cpp", "gpu-cuda", MODEL): LLAMA})
    assert engines.choose(gpu(CUDA_BOTH), MODEL, 4, both, forced="mlx").engine == "mlx"
    only_llama = dev.Machine("Linux", "x86_64", cores=16, llama_gpu=True, cuda_gpus=1)
    with pytest.raises(ValueError, match="driven by llama.cpp"):
        engines.choose(gpu(only_llama), MODEL, 4, both, forced="mlx")
    with pytest.raises(ValueError, match="--engine must be one of"):
        engines.apply(dev.devices(CUDA_BOTH), MODEL, 4, both, forced="vllm")


def test_score_weighs_a_lone_request_and_a_full_batch():
    # Same batch-1 rate, one scales with the batch: it scores higher at max active 4.
    flat, scaling = [500.0] * 4, [500.0, 1000.0, 1500.0, 2000.0]
    assert engines.score(1e4, scaling, 4) > engines.score(1e4, flat, 4)
    assert engines.score(1e4, scaling, 1) == engines.score(1e4, flat, 1)
    assert engines.score(0.0, flat, 4) == 0.0 and engines.score(1e4, [], 4) == 0.0


def test_serve_shows_the_choice_in_the_plan_and_follows_stored_profiles(monkeypatch, tmp_path):
    monkeypatch.setenv("TANDEM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(dev, "probe", lambda: CUDA_BOTH)
    out = CliRunner().invoke(serve, ["--dry-run"]).output
    assert "engine   cuda:0 llama.cpp:" in out and "no stored profile" in out
    from tandem.workers.profiles import save_profile

    for engine, (prefill, decode) in (("llama.cpp", (100.0, [10.0])), ("mlx", MLX)):
        save_profile(engine, "gpu-cuda", MODEL, {"prefill_tok_s": prefill, "decode_tok_s": decode})
    procs = dry_run(monkeypatch, CUDA_BOTH)
    assert flag(procs["gpu0"], "--backend") == "mlx" and flag(procs["gpu0"], "--device") == "gpu"
    assert "--keep-profile" in procs["gpu0"] and "--keep-profile" in procs["cpu0"]
    procs = dry_run(monkeypatch, CUDA_BOTH, "--engine", "llama.cpp")
    assert flag(procs["gpu0"], "--device") == "gpu-cuda"


def test_the_choices_are_recorded_in_the_run_folder(tmp_path):
    both = lookup({("mlx", "gpu-cuda", MODEL): MLX, ("llama.cpp", "gpu-cuda", MODEL): LLAMA})
    found, choices = engines.apply(dev.devices(CUDA_BOTH), MODEL, 16, both)
    assert [d.backend for d in found] == ["llama.cpp", "llama.cpp"]  # the CPU, then cuda:0
    engines.record(choices, tmp_path)
    doc = json.loads((tmp_path / "engines.json").read_text())
    assert doc["cuda:0"]["engine"] == "llama.cpp" and set(doc["cuda:0"]["scores"]) == {
        "llama.cpp",
        "mlx",
    }


def test_a_cuda_box_without_the_cuda_build_is_told_how_to_get_it():
    m = dev.Machine("Linux", "x86_64", cores=16, mlx_cuda=True, cuda_gpus=1)
    assert any("deploy/setup.sh" in h and "CPU-only build" in h for h in dev.hints(m))
    assert not any("CPU-only" in h for h in dev.hints(CUDA_BOTH))


def test_a_serve_worker_keeps_its_first_measurement_and_never_overwrites_one(monkeypatch, tmp_path):
    from types import SimpleNamespace

    from tandem.workers.profiles import keep_start_rates, read_rates

    monkeypatch.setenv("TANDEM_CACHE_DIR", str(tmp_path))
    backend = SimpleNamespace(name="llama.cpp", device="gpu-cuda", model_name=MODEL)
    keep_start_rates(backend, 9000.0, [400.0, 700.0], "quick start-up measurement")
    assert read_rates("llama.cpp", "gpu-cuda", MODEL) == (9000.0, [400.0, 700.0])
    keep_start_rates(backend, 1.0, [1.0], "quick start-up measurement")  # a later start
    assert read_rates("llama.cpp", "gpu-cuda", MODEL) == (9000.0, [400.0, 700.0])


def test_probing_loads_no_gpu_library_into_the_supervisor():
    """The probe's child imports MLX and llama.cpp (where a GPU could be behind them);
    the process asking, serve's supervisor, loads neither: on an H200 it would keep a
    CUDA context (518 MiB) for as long as it lives."""
    import subprocess
    import sys

    code = (
        "import sys; from tandem.launcher.devices import probe; m = probe(); "
        "print(m.cores >= 1, [n for n in ('llama_cpp', 'mlx') if n in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split("\n")[0] == "True []", out.stderr
