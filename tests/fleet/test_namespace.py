"""Runs the fleet tests (a local Ray cluster: a head and two nodes, sim workers)
inside a network namespace of their own with only loopback up: Ray advertises a
host's interface address, never 127.0.0.1, except where loopback is all there is,
and tests may send traffic to loopback only."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.fleet.harness import private_netns

ROOT = Path(__file__).resolve().parents[2]


def _unshare_problem() -> str | None:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "needs unshare(1) and ip(8)"
    probe = subprocess.run(["unshare", "-n", "ip", "link", "set", "lo", "up"],
                           capture_output=True, text=True)  # fmt: skip
    if probe.returncode != 0:
        return f"unshare -n is not permitted here (root is needed): {probe.stderr.strip()}"
    return None


@pytest.mark.timeout(1200)
def test_fleet_suite_in_its_own_network_namespace() -> None:
    if private_netns():
        pytest.skip("already inside a private network namespace: the tests run here")
    if importlib.util.find_spec("ray") is None:
        pytest.skip("Ray is not installed: pip install -e '.[ray]' (deploy/setup.sh does on Linux)")
    problem = _unshare_problem()
    if problem:
        pytest.skip(problem)
    inner = f"{sys.executable} -m pytest -p no:cacheprovider -q -rs tests/fleet"
    # Ray's files (sessions, and ray_current_cluster, which `ray.init("auto")` reads on
    # this machine) in a folder of the run's own, removed after it.
    ray_tmp = tempfile.mkdtemp(prefix="tandem-ray-")
    try:
        run = subprocess.run(
            ["unshare", "-n", "bash", "-c", f"ip link set lo up && exec {inner}"],
            cwd=ROOT, capture_output=True, text=True, timeout=1150,
            env={**os.environ, "RAY_TMPDIR": ray_tmp},
        )  # fmt: skip
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    print(run.stdout[-20000:])
    assert run.returncode == 0, run.stdout[-20000:] + run.stderr[-5000:]
    summary = run.stdout.strip().splitlines()[-1]
    # Inside, only this runner skips: a fleet test skipped there did not run.
    assert " passed" in summary and re.search(r"\b1 skipped", summary), summary
