"""A worker told to stop (SIGTERM) exits within 2 s, even mid-stream, and what it
held is not left hanging: the router migrates the stream to another worker, and
with none to take it the client gets a clear error once --no-worker-wait-s passes."""

from __future__ import annotations

import signal
import subprocess

import pytest

from tandem.client import NoWorkers
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
    router = ["--no-worker-wait-s", "2"]
    with Cluster(workers=[spec], router_args=router) as cl, cl.client(timeout_s=60) as c:
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
        with pytest.raises(NoWorkers):  # the only worker is gone: nowhere to migrate
            for _ in tokens:
                pass
        wait_for(c, lambda workers: workers == [], timeout_s=10)
        assert c.status().requests_in_flight == 0


def test_a_worker_that_stops_cleanly_is_not_probed_after_its_goodbye(tmp_path) -> None:
    """Issue 38, item 6: every clean stop logged "dropping welcome ... Host unreachable".
    The worker's Goodbye and its closed connection reach the router together; the
    close made the router probe every worker at once, the leaving one included, before
    reading the Goodbye. Probes now follow the worker frames of their turn."""
    sim = WorkerSpec("sim0", ["--backend", "sim", "--profile", "cpu-m2", "--warmup", "off"])
    for _ in range(3):  # one stop could be read in two turns by chance: three chances
        with (
            Cluster(workers=[sim], log_dir=tmp_path, transport="tcp") as cl,
            cl.client(timeout_s=30) as c,
        ):
            cl.procs["sim0"].send_signal(signal.SIGTERM)
            cl.procs["sim0"].wait(30)
            wait_for(c, lambda workers: not workers)
    log = (tmp_path / "router.log").read_text()
    assert log.count("worker sim0 removed: said goodbye") == 3, log
    assert "dropping welcome" not in log, log
