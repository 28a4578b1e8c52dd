"""A worker told to stop (SIGTERM) exits within 2 s, even mid-stream, and what it
held ends with a clear error at its client instead of a hang."""

from __future__ import annotations

import signal
import subprocess

import pytest

from tandem.client import WorkerLost
from tandem.launcher.cluster import Cluster, WorkerSpec
from tests.helpers import LLAMA_ARGS, needs_llama, wait_for

EXIT_BOUND_S = 2.0


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param(WorkerSpec("cpu0", LLAMA_ARGS), marks=[needs_llama, pytest.mark.model]),
        WorkerSpec("sim0", ["--backend", "sim", "--profile", "cpu-m2"]),
    ],
    ids=["llama.cpp", "sim"],
)
def test_sigterm_mid_stream_exits_promptly_and_fails_the_stream(spec: WorkerSpec) -> None:
    with Cluster(workers=[spec]) as cl, cl.client(timeout_s=60) as c:
        stream = c.stream("Tell me a long story.", max_tokens=400, ignore_eos=True)
        tokens = iter(stream)
        next(tokens), next(tokens)  # it is streaming
        proc = cl.procs[spec.worker_id]
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=EXIT_BOUND_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail(f"worker still running {EXIT_BOUND_S} s after SIGTERM")
        assert code == 0, cl.log(spec.worker_id)
        with pytest.raises(WorkerLost):
            for _ in tokens:
                pass
        wait_for(c, lambda workers: workers == [], timeout_s=10)
        assert c.status().requests_in_flight == 0
