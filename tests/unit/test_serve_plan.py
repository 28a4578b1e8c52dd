"""`tandem serve`'s plan without starting anything: devices injected (a fake Mac, a
fake CUDA box, a CPU-only box), the config file read, written and read back, bad
keys refused by name, and models named the Hugging Face way found offline."""

from __future__ import annotations

import shlex
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from tandem.cli.serve import COMMANDS, serve
from tandem.common.model_files import (
    ModelNotFound,
    default_model_path,
    model_display_name,
    resolve_model,
)
from tandem.launcher import config as conf
from tandem.launcher import devices as dev
from tandem.launcher.cluster import free_tcp_port
from tandem.launcher.plan import effective, make_plan
from tandem.launcher.screen import curl

MAC = dev.Machine("Darwin", "arm64", cores=10, mlx_metal=True, llama_gpu=True)
CUDA = dev.Machine("Linux", "x86_64", cores=16, mlx_cuda=True, cuda_gpus=2)
CUDA_LLAMA = dev.Machine("Linux", "x86_64", cores=16, llama_gpu=True, cuda_gpus=1)
CPU_ONLY = dev.Machine("Linux", "x86_64", cores=2)


def dry_run(monkeypatch, machine: dev.Machine, *args: str) -> dict[str, list[str]]:
    """`tandem serve --dry-run ARGS` on ``machine``: each process's argv by name."""
    monkeypatch.setattr(dev, "probe", lambda: machine)
    result = CliRunner().invoke(serve, ["--dry-run", *args])
    assert result.exit_code == 0, result.output
    procs = {}
    for line in result.output.splitlines():
        name, _, rest = line.partition(" ")
        if name not in ("endpoint", "remote", "engine", "note:"):
            words = shlex.split(rest)
            procs[name] = words[words.index("tandem") + 1 :] if "tandem" in words else words
    return procs


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def test_fake_mac_serves_metal_through_mlx_and_the_cpu_through_llama_cpp(monkeypatch):
    procs = dry_run(monkeypatch, MAC)
    assert list(procs) == ["router", "cpu0", "gpu0", "gateway"]
    assert flag(procs["gpu0"], "--backend") == "mlx" and flag(procs["gpu0"], "--device") == "gpu"
    assert flag(procs["gpu0"], "--max-active") == "16"
    # 10 cores less the router, the gateway and the GPU worker's host thread.
    assert flag(procs["cpu0"], "--threads") == "7"
    assert flag(procs["cpu0"], "--backend") == "llama.cpp"
    assert flag(procs["gateway"], "--port") == "8000"
    assert flag(procs["cpu0"], "--router") == flag(procs["router"], "--worker-addr")
    assert flag(procs["gateway"], "--router") == flag(procs["router"], "--client-addr")
    assert list(dry_run(monkeypatch, MAC, "--devices", "cpu")) == ["router", "cpu0", "gateway"]


def test_fake_cuda_box_gets_one_worker_per_gpu(monkeypatch, capsys):
    monkeypatch.setattr(dev, "probe", lambda: CUDA)
    out = CliRunner().invoke(serve, ["--dry-run", "--api-key", "s3cret"]).output
    assert "CUDA_VISIBLE_DEVICES=0" in out and "CUDA_VISIBLE_DEVICES=1" in out
    assert "s3cret" not in out  # the key travels in the gateway's environment, masked here
    procs = dry_run(monkeypatch, CUDA)
    assert list(procs) == ["router", "cpu0", "gpu0", "gpu1", "gateway"]
    assert flag(procs["cpu0"], "--threads") == "12"
    assert list(dry_run(monkeypatch, CUDA, "--devices", "cuda:1")) == ["router", "gpu0", "gateway"]
    # A CUDA build of llama.cpp and no MLX: the GPU worker is llama.cpp, offloading.
    procs = dry_run(monkeypatch, CUDA_LLAMA)
    assert flag(procs["gpu0"], "--backend") == "llama.cpp"
    assert flag(procs["gpu0"], "--device") == "gpu-cuda"


def test_cpu_only_box_keeps_one_thread_and_refuses_a_gpu(monkeypatch):
    procs = dry_run(monkeypatch, CPU_ONLY, "--max-active", "2", "--policy", "least_loaded")
    assert list(procs) == ["router", "cpu0", "gateway"]
    assert flag(procs["cpu0"], "--threads") == "1"  # 2 cores - router - gateway, never < 1
    assert flag(procs["cpu0"], "--max-active") == "2"
    assert flag(procs["router"], "--policy") == "least_loaded"
    result = CliRunner().invoke(serve, ["--dry-run", "--devices", "gpu"])
    assert result.exit_code != 0 and "this machine has cpu" in result.output


def test_the_gateway_always_knows_the_model_by_its_display_name(monkeypatch, tmp_path):
    """So /v1/models lists it while the workers start (models.list().data[0].id)."""
    procs = dry_run(monkeypatch, CPU_ONLY)
    assert flag(procs["gateway"], "--model-alias") == "SmolLM2-135M-Instruct"  # the default
    gguf = tmp_path / "tiny-model.Q8_0.gguf"
    gguf.write_bytes(b"GGUF")
    procs = dry_run(monkeypatch, CPU_ONLY, str(gguf))
    assert flag(procs["gateway"], "--model-alias") == "tiny-model"


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        (None, "SmolLM2-135M-Instruct"),
        ("SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2-135M-Instruct"),
        ("/models/qwen2-0_5b-instruct-q4_k_m.gguf", "qwen2-0_5b-instruct"),
        ("/models/llama-IQ3_XS.gguf", "llama"),
        ("/models/phi-bf16.gguf", "phi"),
        ("/models/Q8_0.gguf", "Q8_0"),  # nothing but a quantization: kept
        ("org/Name-GGUF:Q4_K_M", "org/Name-GGUF"),
        ("org/Name-GGUF/name-Q4_K_M.gguf", "org/Name-GGUF"),
        ("/models/mlx-Qwen2-0.5B/", "mlx-Qwen2-0.5B"),
    ],
)
def test_a_model_display_name_is_its_repo_or_its_file_without_quantization(name, shown):
    assert model_display_name(name) == shown


CONFIG = """
model = "org/Tiny-GGUF:Q4_K_M"
[router]
policy = "least_loaded"
calibrate = false
[gateway]
port = 9000
api_key = "k"
model_alias = ["tiny", "small"]
[worker]
n_ctx = 2048
[[workers]]
worker_id = "cpu0"
threads = 1
[[workers]]
worker_id = "gpu-box"
remote = true
"""


def test_config_round_trip_gives_the_same_plan(tmp_path, monkeypatch):
    monkeypatch.setattr(dev, "probe", lambda: MAC)
    first = tmp_path / "tandem.toml"
    first.write_text(CONFIG)
    printed = CliRunner().invoke(serve, ["--config", str(first), "--print-config"])
    assert printed.exit_code == 0, printed.output
    second = tmp_path / "printed.toml"
    second.write_text(printed.output)
    # What the file set, printed back; beside it what was in effect by default.
    wrote, was = conf.load(second), effective(conf.load(first), dev.devices(MAC))
    assert wrote.workers == was.workers and wrote.model == was.model
    for section in ("router", "gateway", "worker"):
        assert getattr(was, section).items() <= getattr(wrote, section).items(), section
    plans = [make_plan(effective(conf.load(f), []), COMMANDS) for f in (first, second)]
    assert plans[0] == plans[1]
    plan = plans[0]
    assert [p.name for p in plan.procs] == ["router", "cpu0", "gateway"]  # listed workers only
    assert plan.remote == ("gpu-box",) and plan.url.endswith(":9000") and plan.api_key == "k"
    router, cpu0, gateway = (list(p.argv) for p in plan.procs)
    assert "--no-calibrate" in router and flag(cpu0, "--n-ctx") == "2048"
    # tiny, small, the model's display name (its repo id) and the hub name it was served by
    aliases = [gateway[i + 1] for i, a in enumerate(gateway) if a == "--model-alias"]
    assert aliases == ["tiny", "small", "org/Tiny-GGUF", "org/Tiny-GGUF:Q4_K_M"]
    # Flags override the file.
    procs = dry_run(monkeypatch, MAC, "--config", str(first), "--port", "9100", "--threads", "3")
    assert flag(procs["gateway"], "--port") == "9100" and flag(procs["cpu0"], "--threads") == "3"


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ('modle = "x"', "'modle'"),
        ("[router]\npolcy = 'x'", "'polcy'"),
        ("[[workers]]\nworker_id = 'cpu0'\nthread = 2", "'thread'"),
        ("[gateway]\nrouter = 'tcp://x:1'", "client_addr"),
        ("[worker]\nthreads = 'many'", "--threads"),
        ("[gateway]\nport = 'http'", "port must be a port number"),
        ("[[workers]]\nworker_id = 'a'\nremote = true\nthreads = 2", "remote worker"),
    ],
)
def test_bad_config_is_refused_naming_the_key(tmp_path, monkeypatch, text, named):
    monkeypatch.setattr(dev, "probe", lambda: CPU_ONLY)
    path = tmp_path / "bad.toml"
    path.write_text(text)
    result = CliRunner().invoke(serve, ["--config", str(path), "--dry-run"])
    assert result.exit_code != 0
    assert named in result.output, result.output


def hub_cache(root: Path, repo: str, files: list[str], rev: str = "0123abcd") -> Path:
    """A hub cache laid out as huggingface_hub lays it out: blobs, a snapshot of
    symlinks to them, refs/main naming the snapshot."""
    folder = root / ("models--" + repo.replace("/", "--"))
    (folder / "blobs").mkdir(parents=True)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(rev)
    snap = folder / "snapshots" / rev
    snap.mkdir(parents=True)
    for i, name in enumerate(files):
        blob = folder / "blobs" / f"blob{i}"
        blob.symlink_to(default_model_path())
        (snap / name).symlink_to(Path("../..") / "blobs" / blob.name)
    return snap


def test_hub_names_resolve_from_the_cache_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    snap = hub_cache(tmp_path, "org/Tiny-GGUF", ["tiny-Q8_0.gguf", "tiny-Q4_K_M.gguf"])
    assert resolve_model("org/Tiny-GGUF:Q8_0") == snap / "tiny-Q8_0.gguf"
    assert resolve_model("org/Tiny-GGUF/tiny-Q8_0.gguf") == snap / "tiny-Q8_0.gguf"
    assert resolve_model("org/Tiny-GGUF") == snap / "tiny-Q4_K_M.gguf"  # preferred quant
    assert resolve_model(None) == default_model_path()
    # huggingface_hub itself finds the same file there.
    hf = pytest.importorskip("huggingface_hub")
    found = hf.try_to_load_from_cache("org/Tiny-GGUF", "tiny-Q8_0.gguf", cache_dir=tmp_path)
    assert Path(found) == snap / "tiny-Q8_0.gguf"
    # HF_HOME/hub is the cache when HF_HUB_CACHE is unset.
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    snap = hub_cache(tmp_path / "home" / "hub", "org/Other", ["x.Q4_0.gguf"])
    assert resolve_model("org/Other") == snap / "x.Q4_0.gguf"


def test_a_missing_hub_model_says_what_to_place_where(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    hub_cache(tmp_path, "org/Tiny-GGUF", ["tiny-Q8_0.gguf"])
    with pytest.raises(ModelNotFound) as err:
        resolve_model("org/Tiny-GGUF:Q5_K_S")
    text = str(err.value)
    assert str(tmp_path / "models--org--Tiny-GGUF") in text
    assert "hf download org/Tiny-GGUF --include '*Q5_K_S*.gguf'" in text
    # Online but the hub unreachable: said at once, naming the endpoint tried.
    monkeypatch.delenv("HF_HUB_OFFLINE")
    for proxy in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(proxy, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_tcp_port()}")
    with pytest.raises(ModelNotFound, match="unreachable"):
        resolve_model("org/Tiny-GGUF:Q5_K_S")
    with pytest.raises(ModelNotFound, match="no such file"):
        resolve_model("missing/model.gguf")
    result = CliRunner().invoke(serve, ["org/Absent-GGUF:Q4_0", "--port", "1"])
    assert result.exit_code != 0 and "models--org--Absent-GGUF" in result.output


def test_a_worker_takes_a_hub_name_for_its_model(tmp_path, monkeypatch):
    """`tandem worker --model ORG/NAME-GGUF:QUANT` loads the file the name resolves to
    (the sim backend: it reads the GGUF's name and tokenizer, runs no model)."""
    from tandem.workers.backends import build_backend
    from tandem.workers.config import WorkerConfig

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    hub_cache(tmp_path, "org/Tiny-GGUF", ["tiny-Q4_1.gguf"])
    cfg = WorkerConfig(router="tcp://127.0.0.1:1", backend="sim", profile="cpu-m2",
                       model="org/Tiny-GGUF:Q4_1")  # fmt: skip
    assert build_backend(cfg).model_name == "tiny-Q4_1.gguf"
    with pytest.raises(FileNotFoundError, match="models--org--Gone"):
        build_backend(WorkerConfig(router="tcp://127.0.0.1:1", backend="sim", profile="cpu-m2",
                                   model="org/Gone:Q4_1"))  # fmt: skip


def test_a_gpu_no_backend_can_use_is_named_with_what_to_install():
    bare = dev.Machine("Linux", "x86_64", cores=16, cuda_gpus=2)
    assert [d.kind for d in dev.devices(bare)] == ["cpu"]
    assert any("mlx-cuda" in h for h in dev.hints(bare))
    assert dev.hints(CUDA_LLAMA) == [] and dev.hints(CPU_ONLY) == []
    # MLX can drive it, but the faster engine's CUDA build is missing: said, with the fix.
    assert [h for h in dev.hints(CUDA) if "deploy/setup.sh" in h]


def test_curve_keys_reach_every_process_and_a_bad_folder_is_refused(tmp_path, monkeypatch):
    from tandem.common.auth import make_keys

    make_keys(tmp_path / "k")
    monkeypatch.setattr(dev, "probe", lambda: MAC)
    cfg = effective(conf.ServeConfig(keys=str(tmp_path / "k")), dev.devices(MAC))
    plan = make_plan(cfg, COMMANDS)
    for proc in plan.procs:
        given = flag(list(proc.argv), "--keys") or dict(proc.env).get("TANDEM_KEYS")
        assert given == str(tmp_path / "k"), proc  # the gateway by environment: no --keys
    result = CliRunner().invoke(serve, ["--dry-run", "--keys", str(tmp_path)])
    assert result.exit_code != 0 and "not a tandem keys folder" in result.output


def test_print_config_shows_the_model_and_the_addresses_in_effect(monkeypatch):
    """Issue 38, item 6: with no file and no flags it printed the workers alone."""
    monkeypatch.setattr(dev, "probe", lambda: CPU_ONLY)
    client, worker = f"tcp://127.0.0.1:{free_tcp_port()}", f"tcp://127.0.0.1:{free_tcp_port()}"
    monkeypatch.setenv("TANDEM_CLIENT_ADDR", client)
    monkeypatch.setenv("TANDEM_WORKER_ADDR", worker)
    monkeypatch.setenv("TANDEM_GATEWAY_PORT", "9123")
    printed = CliRunner().invoke(serve, ["--print-config"])
    assert printed.exit_code == 0, printed.output
    cfg = tomllib.loads(printed.output)
    assert cfg["model"] == str(default_model_path())
    assert cfg["router"] == {"policy": "lookahead", "client_addr": client, "worker_addr": worker}
    assert cfg["gateway"] == {"host": "127.0.0.1", "port": 9123}


class _Started:
    """Stands in for the Supervisor and its Screen: records the run, starts nothing."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass

    def run(self, keys: str | None) -> int:
        return 0


def test_the_run_folders_config_is_readable_by_its_owner_alone(tmp_path, monkeypatch):
    """Issue 38, item 6: tandem.toml held the API key in a 0644 file."""
    monkeypatch.setattr(dev, "probe", lambda: CPU_ONLY)
    monkeypatch.setattr("tandem.launcher.supervisor.Supervisor", _Started)
    monkeypatch.setattr("tandem.launcher.screen.Screen", _Started)
    run = tmp_path / "run"
    run.mkdir()
    (run / "tandem.toml").write_text("old")
    (run / "tandem.toml").chmod(0o644)  # a folder used before: its file's mode is reset
    args = ["--api-key", "sekret-key", "--run-dir", str(run), "--devices", "cpu"]
    result = CliRunner().invoke(serve, args)
    assert result.exit_code == 0, result.output
    written = run / "tandem.toml"
    assert written.stat().st_mode & 0o777 == 0o600
    assert tomllib.loads(written.read_text())["gateway"]["api_key"] == "sekret-key"
    assert "sekret-key" not in (run / "plan.txt").read_text()  # masked there


def test_the_curl_serve_prints_is_silent_and_sends_the_key():
    """Issue 38, item 6: the curl to paste printed curl's progress meter over the answer."""
    cfg = conf.ServeConfig(gateway={"api_key": "k", "port": 9001})
    shown = shlex.split(curl(make_plan(effective(cfg, []), COMMANDS), "m"))
    assert shown[:3] == ["curl", "-s", "http://127.0.0.1:9001/v1/chat/completions"]
    assert "Authorization: Bearer k" in shown
