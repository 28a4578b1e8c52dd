"""tandem serve --ray on a cluster where no node offers `tandem-router`: the router
goes to the head; one fleet per cluster; status says clearly when there is none.
Run by test_namespace.py inside a private network namespace."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.fleet.harness import SIM, LocalRay, Serve, chat, free_port

TANDEM = [sys.executable, "-m", "tandem"]


@pytest.fixture(scope="module")
def local():
    cluster = LocalRay(nodes=1)
    yield cluster
    cluster.shutdown()


def test_status_without_a_fleet_says_so(local: LocalRay) -> None:
    out = subprocess.run([*TANDEM, "status", "--ray", local.address],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 1 and "no tandem fleet on the Ray cluster" in out.stderr


def test_the_router_goes_to_the_head_and_a_second_fleet_is_refused(
    local: LocalRay, tmp_path: Path
) -> None:
    import ray

    from tandem.fleet import NAMESPACE

    serve = Serve(local.address, log=tmp_path / "serve.log")
    try:
        serve.wait_for("ready:", 120)
        answer = chat(f"http://127.0.0.1:{serve.port}", "Hello", max_tokens=5)
        assert answer["usage"]["completion_tokens"] == 5
        ray.init(address=local.address, namespace=NAMESPACE, log_to_driver=False)
        try:
            where = ray.get(ray.get_actor("router").address.remote())
            assert where.node_id == local.cluster.head_node.node_id
        finally:
            ray.shutdown()
        second = subprocess.run(
            [*TANDEM, "serve", "--ray", local.address, "--port", str(free_port()), *SIM],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert second.returncode == 1
        assert "a tandem fleet already serves on this Ray cluster" in second.stderr
        chat(f"http://127.0.0.1:{serve.port}", "Still here?", max_tokens=3)  # untouched
    finally:
        assert serve.stop() == 0
