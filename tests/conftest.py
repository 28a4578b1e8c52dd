"""Fixtures shared by the test layers; plain helpers live in tests/helpers.py."""

from __future__ import annotations

import pytest

from tandem.launcher.cluster import Cluster, WorkerSpec
from tests.helpers import LLAMA_ARGS, Harness


@pytest.fixture(scope="module")
def cluster():
    """One router and one llama.cpp worker, shared by a test module."""
    with Cluster(
        workers=[WorkerSpec("cpu0", LLAMA_ARGS)], router_args=["--policy", "least_loaded"]
    ) as c:
        yield c


@pytest.fixture
def h(tmp_path):
    """A Router in-process on inproc:// sockets, pumped by hand (tests.helpers.Harness)."""
    harness = Harness(tmp_path)
    yield harness
    harness.close()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark by layer: every parity test and every test on the llama.cpp `cluster`
    fixture needs the real model (`-m "not model"` is the fast loop), and MLX
    parity tests carry `mlx` too."""
    for item in items:
        path = str(item.path)
        if "/tests/parity/" in path or "cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.model)
        if "/tests/parity/test_mlx" in path:
            item.add_marker(pytest.mark.mlx)
