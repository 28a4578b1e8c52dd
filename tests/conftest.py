"""Shared fixtures: a real cluster (router + llama.cpp worker processes) on the real model."""

from __future__ import annotations

import importlib.util

import pytest

from client.cluster import Cluster, WorkerSpec

HAVE_LLAMA = importlib.util.find_spec("llama_cpp") is not None
needs_llama = pytest.mark.skipif(not HAVE_LLAMA, reason="llama-cpp-python is not installed")

# Small contexts keep worker start-up and memory low on a 2-core machine.
LLAMA_ARGS = ["--threads", "1", "--n-ctx", "4096", "--max-active", "4", "--heartbeat-s", "0.2"]


@pytest.fixture(scope="module")
def cluster():
    """One router and one llama.cpp worker, shared by a test module."""
    with Cluster(
        workers=[WorkerSpec("cpu0", LLAMA_ARGS)], router_args=["--policy", "least_loaded"]
    ) as c:
        yield c
