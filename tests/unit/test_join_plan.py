"""What `tandem join` starts on a machine and where `tandem serve --listen` listens:
pure plans, no processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tandem.cli.processes import worker as worker_command
from tandem.launcher import devices as dev
from tandem.launcher.config import ServeConfig
from tandem.launcher.joinrun import join_plan
from tandem.launcher.plan import join_address, make_plan, with_host
from tests.unit.test_serve_plan import COMMANDS, MAC, dry_run, flag


def test_a_mac_joins_with_a_worker_per_device_named_by_its_node():
    found = dev.devices(MAC)
    plan = join_plan(found, "mac-studio", "tcp://10.0.0.5:5556", Path("/k"), None, {},
                     worker_command)  # fmt: skip
    argv = {p.name: p.argv for p in plan.procs}
    assert list(argv) == ["mac-studio-cpu0", "mac-studio-gpu0"]
    assert [p.role for p in plan.procs] == ["worker", "worker"]  # no router, no gateway
    for a in argv.values():
        assert flag(list(a), "--router") == "tcp://10.0.0.5:5556"
        assert flag(list(a), "--keys") == "/k" and flag(list(a), "--node") == "mac-studio"
        assert "--progress-json" in a
    assert flag(list(argv["mac-studio-gpu0"]), "--backend") == "mlx"
    # 10 cores: one for the GPU worker's host thread, one left over; no router here.
    assert flag(list(argv["mac-studio-cpu0"]), "--threads") == "8"


def test_join_knobs_reach_every_worker_and_the_model_is_passed():
    found = dev.devices(MAC)
    plan = join_plan(found, "m", "tcp://h:1", Path("/k"), "org/Smol-GGUF:Q4_1",
                     {"max_active": 2, "threads": 3}, worker_command)  # fmt: skip
    for p in plan.procs:
        assert flag(list(p.argv), "--max-active") == "2"
        assert flag(list(p.argv), "--model") == "org/Smol-GGUF:Q4_1"
    assert flag(list(plan.procs[0].argv), "--threads") == "3"


def test_listen_moves_the_worker_socket_and_the_join_service_to_its_host(monkeypatch):
    procs = dry_run(monkeypatch, dev.Machine("Linux", "x86_64", cores=4), "--listen", "0.0.0.0")
    assert flag(procs["router"], "--worker-addr") == "tcp://0.0.0.0:5556"
    assert flag(procs["router"], "--client-addr") == "tcp://127.0.0.1:5555"  # stays local
    cfg = ServeConfig(listen="0.0.0.0")
    plan = make_plan(cfg, COMMANDS)
    assert join_address(cfg, plan.worker_addr) == "tcp://0.0.0.0:5557"
    assert join_address(ServeConfig(), plan.worker_addr) is None  # this host only: none
    remote = ServeConfig(workers=({"worker_id": "far", "remote": True},))
    assert join_address(remote, "tcp://127.0.0.1:5556") == "tcp://127.0.0.1:5557"
    assert join_address(ServeConfig(join_addr="tcp://h:9"), "tcp://x:1") == "tcp://h:9"


def test_listen_needs_a_tcp_worker_address():
    assert with_host("tcp://127.0.0.1:7000", "::") == "tcp://[::]:7000"
    with pytest.raises(ValueError, match="tcp://"):
        with_host("ipc:///tmp/w", "0.0.0.0")
