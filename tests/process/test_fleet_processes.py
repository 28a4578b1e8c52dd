"""The fleet's parts that start processes, without Ray: keys that a real router,
worker and client accept, and the supervised subprocess's restarts."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tandem.fleet.keys import FleetKeys
from tandem.fleet.process import Managed


def test_fleet_keys_authenticate_against_a_real_router(tmp_path: Path) -> None:
    """A router, a sim worker and a client on the written folders: the worker
    registers, the client is answered; a client of another fleet is refused."""
    from tandem.client import Client
    from tandem.client.errors import HandshakeRefused
    from tandem.launcher.cluster import Cluster, WorkerSpec

    keys = FleetKeys.new()
    every = keys.write(tmp_path / "all", ("router", "worker", "client"))
    sim = ["--backend", "sim", "--profile", "cpu-m2", "--warmup", "off"]
    with Cluster(workers=[WorkerSpec("w0", sim)], keys=str(every)) as c:
        client_only = keys.write(tmp_path / "client", ("client",))
        with Client(c.client_addr, keys=str(client_only), timeout_s=10) as client:
            assert [w["id"] for w in client.status().workers] == ["w0"]
        stranger = FleetKeys.new().write(tmp_path / "stranger", ("client",))
        with (
            pytest.raises(HandshakeRefused),
            Client(c.client_addr, keys=str(stranger), timeout_s=5, retries=0) as client,
        ):
            client.status()


def test_managed_restarts_an_exited_process_with_backoff(tmp_path: Path) -> None:
    m = Managed("k", ("keys", str(tmp_path / "k")), {}, tmp_path / "k.log")
    m.start()
    assert m.popen is not None and m.popen.wait(30) == 0
    said = m.check(time.monotonic())
    assert said is not None and said.startswith("exited (0); restarting in 0.0 s")
    assert m.check(time.monotonic()) == f"restarted (pid {m.pid})" and m.restarts == 1
    assert m.popen.wait(30) == 2  # the folder holds keys now: refused, a second quick exit
    said = m.check(time.monotonic())
    assert said is not None and "restarting in 0.5 s" in said
    assert m.check(time.monotonic()) is None  # not due yet
    assert m.check(time.monotonic() + 1.0) is not None and m.restarts == 2
    assert m.popen.wait(30) == 2
    assert "restarting in 1.0 s" in (m.check(time.monotonic()) or "")
    m.stop()
    assert "already holds keys" in m.tail()
