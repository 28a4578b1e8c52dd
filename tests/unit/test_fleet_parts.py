"""The parts of `tandem serve --ray` that need no Ray and start no process: the keys
it writes, what each actor starts, the bounds, the errors before Ray is reached."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tandem.cli.main import main
from tandem.cli.serve import COMMANDS
from tandem.fleet import RayMissing, need_ray
from tandem.fleet.keys import FleetKeys, private_dir
from tandem.fleet.plans import host_plan, router_ports, worker_plan
from tandem.fleet.process import Managed
from tandem.launcher import devices as devices_module
from tandem.launcher.config import ServeConfig

NODE = "0123456789abcdef" * 3
SIM = {"backend": "sim", "profile": "cpu-m2"}


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_keys_are_written_private_and_only_the_roles_asked(tmp_path: Path) -> None:
    keys = FleetKeys.new()
    worker = keys.write(tmp_path / "w", ("worker",))
    assert _mode(worker) == 0o700
    assert sorted(p.name for p in worker.iterdir()) == ["router.key", "worker.key_secret"]
    assert all(_mode(p) == 0o600 for p in worker.iterdir())
    assert keys.worker.secret in (worker / "worker.key_secret").read_text()
    assert keys.router.secret not in "".join(p.read_text() for p in worker.iterdir())
    router = keys.write(tmp_path / "r", ("router", "client"))
    assert {p.name for p in router.iterdir()} >= {"router.key_secret", "workers", "clients"}


def test_private_dir_is_0700_and_stale_ones_go(tmp_path: Path) -> None:
    first = private_dir("tandem-test-")
    try:
        assert _mode(first) == 0o700 and f"pid{os.getpid()}-" in first.name
        stale = first.parent / "tandem-test-pid999999999-x"  # no such process
        stale.mkdir()
        second = private_dir("tandem-test-")
        assert not stale.exists() and first.exists()
        second.rmdir()
    finally:
        first.rmdir()


def test_router_ports() -> None:
    assert router_ports(ServeConfig()) == (5555, 5556)
    given = ServeConfig(router={"client_addr": "tcp://0.0.0.0:7000", "worker_addr": "tcp://x:0"})
    assert router_ports(given) == (7000, 0)
    with pytest.raises(ValueError, match="client_addr"):
        router_ports(ServeConfig(router={"client_addr": "ipc:///tmp/x"}))


def test_host_plan_binds_the_node_address(tmp_path: Path) -> None:
    cfg = ServeConfig(gateway={"port": 8100})
    plan = host_plan(cfg, NODE, "10.0.0.7", (7000, 7001), tmp_path, COMMANDS)
    router, gateway = plan.procs
    assert ("TANDEM_NODE", NODE) in router.env and ("TANDEM_NODE", NODE) in gateway.env
    assert plan.client_addr == "tcp://10.0.0.7:7000" and plan.worker_addr == "tcp://10.0.0.7:7001"
    assert "--keys" in router.argv and str(tmp_path) in router.argv
    assert ("TANDEM_KEYS", str(tmp_path)) in gateway.env  # a secret's folder, not in argv
    assert gateway.argv[gateway.argv.index("--router") + 1] == plan.client_addr


def test_worker_plan_names_workers_by_node_and_sets_tandem_node(tmp_path: Path) -> None:
    cfg = ServeConfig(worker=SIM)
    (cpu,) = worker_plan(cfg, NODE, [], "tcp://10.0.0.7:7001", tmp_path / "r", tmp_path, COMMANDS)
    assert cpu.name == f"{NODE[:8]}-cpu0"
    assert cpu.argv[cpu.argv.index("--router") + 1] == "tcp://10.0.0.7:7001"
    assert cpu.argv[cpu.argv.index("--worker-id") + 1] == cpu.name
    assert ("TANDEM_NODE", NODE) in cpu.env
    assert cpu.argv[cpu.argv.index("--router-file") + 1] == str(tmp_path / "r")


def test_worker_plan_one_worker_per_gpu_ray_gave(tmp_path: Path, monkeypatch) -> None:
    box = devices_module.Machine("Linux", "x86_64", 8, mlx_cuda=True, cuda_gpus=4)
    monkeypatch.setattr(devices_module, "probe", lambda: box)
    procs = worker_plan(
        ServeConfig(), NODE, ["2", "3"], "tcp://h:1", tmp_path / "r", tmp_path, COMMANDS
    )
    gpus = [p for p in procs if "-gpu" in p.name]
    assert [p.name for p in gpus] == [f"{NODE[:8]}-gpu0", f"{NODE[:8]}-gpu1"]
    assert [dict(p.env)["CUDA_VISIBLE_DEVICES"] for p in gpus] == ["2", "3"]
    # No GPU engine on the node: the GPUs Ray gave get no worker (the CPU still does).
    monkeypatch.setattr(devices_module, "probe", lambda: devices_module.Machine("Linux", "x", 8))
    procs = worker_plan(ServeConfig(), NODE, ["0"], "tcp://h:1", tmp_path / "r", tmp_path, COMMANDS)
    assert [p.name for p in procs] == [f"{NODE[:8]}-cpu0"]


def test_serve_ray_without_ray_says_how_to_install(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(RayMissing, match=r"tandem-serve\[ray\]"):
        need_ray()
    result = CliRunner().invoke(main, ["serve", "--ray", "auto"])
    assert result.exit_code == 1
    assert "tandem-serve[ray]" in result.output
    result = CliRunner().invoke(main, ["status", "--ray"])
    assert result.exit_code == 1 and "tandem-serve[ray]" in result.output


def test_serve_ray_refuses_a_bad_flag_before_reaching_ray(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # were a check to pass: no cluster reached
    result = CliRunner().invoke(main, ["serve", "--ray", "auto", "--set", "worker.nope=1"])
    assert result.exit_code == 1 and "nope" in result.output
    result = CliRunner().invoke(main, ["serve", "--ray", "auto", "--set", "router.liveness_s='x'"])
    assert result.exit_code == 1 and "liveness" in result.output
    bad = ["serve", "--ray", "auto", "--set", "router.client_addr='ipc:///tmp/x'"]
    result = CliRunner().invoke(main, bad)
    assert result.exit_code == 1 and "client_addr" in result.output


def test_serve_ray_refuses_what_it_cannot_do() -> None:
    result = CliRunner().invoke(main, ["serve", "--ray", "auto", "--dry-run"])
    assert result.exit_code == 1 and "drop --ray" in result.output
    result = CliRunner().invoke(main, ["serve", "--ray", "auto", "--keys", "/nonexistent"])
    assert result.exit_code == 1


def test_registrations_changes_are_bounded_under_a_flood(tmp_path: Path) -> None:
    """A router listing thousands of workers coming and going, with nobody reading the
    changes: the queue keeps CHANGES_KEPT of them, the current set stays exact."""
    from tandem.fleet.watch import CHANGES_KEPT, Registrations

    watch = Registrations(tmp_path)
    for wave in range(5):
        watch._update({f"w{wave}-{i}": {"backend": "sim", "device": "cpu"} for i in range(2000)})
    assert watch._changes.qsize() == CHANGES_KEPT
    assert len(watch.registered()) == 2000 and all(w.startswith("w4-") for w in watch.registered())
    assert len(watch.changes()) == CHANGES_KEPT and watch.changes() == []


def test_managed_tail_reads_the_end_of_a_huge_log(tmp_path: Path) -> None:
    from tandem.fleet.process import TAIL_BYTES

    log = tmp_path / "w.log"
    log.write_bytes(b"noise\n" * 2_000_000 + b"last words\n")
    m = Managed("w", ("worker",), {}, log)
    assert log.stat().st_size > 10 * TAIL_BYTES
    assert m.tail(2).splitlines()[-1] == "last words"
