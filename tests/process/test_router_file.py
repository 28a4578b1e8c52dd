"""`tandem worker --router-file`: a worker follows the router's address written in a
file to a router that moved, re-registering there without restarting, and drops
what the old router gave it (tandem serve --ray's agents rewrite the file)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tandem.launcher.cluster import Cluster, WorkerSpec
from tandem.workers.follow import RouterFile, read_address, write_address

SIM = ["--backend", "sim", "--profile", "cpu-m2", "--warmup", "off", "--heartbeat-s", "0.2"]


def test_a_worker_follows_its_router_file_to_a_router_that_moved(tmp_path: Path) -> None:
    with Cluster() as old, Cluster() as new:
        path = tmp_path / "router"
        write_address(path, old.worker_addr)
        spec = WorkerSpec("w0", ["--router-file", str(path), *SIM])
        old.start_worker(spec)  # registers with the router the file names
        pid = old.procs["w0"].pid
        with old.client() as c:
            assert c.generate("before", max_tokens=4).worker == "w0"
        write_address(path, new.worker_addr)  # the router moved
        new.wait_for_workers({"w0"})
        with new.client() as c:
            result = c.generate("after", max_tokens=5)
        assert result.worker == "w0" and len(result.token_ids) == 5
        assert old.procs["w0"].pid == pid and old.procs["w0"].poll() is None  # same process


def test_router_file_reading(tmp_path: Path) -> None:
    path = tmp_path / "router"
    with pytest.raises(ValueError, match="cannot read"):
        read_address(path)
    path.write_text("not an address\n")
    with pytest.raises(ValueError, match="no router address"):
        read_address(path)
    write_address(path, "tcp://10.0.0.1:5556")
    assert path.stat().st_mode & 0o777 == 0o600
    follow = RouterFile(path, read_address(path))
    assert follow.moved() is None  # unchanged
    write_address(path, "tcp://10.0.0.2:5556")
    assert follow.moved() == "tcp://10.0.0.2:5556"
    assert follow.moved() is None
    path.write_text("garbage")  # a bad write keeps the address it had
    assert follow.moved() is None and follow.current == "tcp://10.0.0.2:5556"
