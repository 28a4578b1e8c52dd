"""Fixtures shared by the test layers; plain helpers live in tests/helpers.py."""

from __future__ import annotations

import pytest

from tandem.launcher.cluster import Cluster, WorkerSpec
from tests.helpers import LLAMA_ARGS


@pytest.fixture(scope="module")
def cluster():
    """One router and one llama.cpp worker, shared by a test module."""
    with Cluster(
        workers=[WorkerSpec("cpu0", LLAMA_ARGS)], router_args=["--policy", "least_loaded"]
    ) as c:
        yield c
