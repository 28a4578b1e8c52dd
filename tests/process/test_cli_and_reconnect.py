"""The CLI's JSON output, and workers finding a restarted router on their own."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tandem.launcher.cluster import Cluster, WorkerSpec
from tests.helpers import LLAMA_ARGS, needs_llama

pytestmark = [needs_llama, pytest.mark.model]


def tandem(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tandem", *args], capture_output=True, text=True, timeout=120
    )


def test_generate_and_status_print_one_json_document(cluster):
    out = tandem(
        "generate", "Name a color.", "--router", cluster.client_addr, "--json", "--max-tokens", "5"
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["finish_reason"] in ("length", "eos") and doc["worker"] == "cpu0"
    assert doc["stats"]["output_tokens"] == len(doc["token_ids"]) <= 5
    status = tandem("status", "--router", cluster.client_addr, "--json")
    assert status.returncode == 0, status.stderr
    (row,) = json.loads(status.stdout)["workers"]
    assert row["id"] == "cpu0" and row["backend"] == "llama.cpp"


def test_generate_reports_errors_on_stderr_with_a_nonzero_exit(cluster):
    # A bad argument is one line naming it, no traceback ...
    for flag, value in (("--temperature", "nan"), ("--max-tokens", str(2**64))):
        out = tandem("generate", "x", "--router", cluster.client_addr, flag, value)
        assert out.returncode == 1 and out.stdout == ""
        assert "bad_request" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    # ... and so is a request the router refuses.
    out = tandem("generate", "x", "--router", cluster.client_addr, "--max-tokens", "0")
    assert out.returncode == 1 and "bad_request" in out.stderr and out.stdout == ""
    out = tandem("generate", "x", "--router", cluster.client_addr, "--max-tokens", "100000")
    assert out.returncode == 1
    assert "prompt_too_long" in out.stderr and out.stdout == ""


def test_workers_reregister_with_a_restarted_router():
    with Cluster(workers=[WorkerSpec("w", LLAMA_ARGS)]) as cl:
        cl.kill("router")
        time.sleep(0.5)
        cl.start_router()
        cl.wait_for_workers({"w"})  # the worker's heartbeat got "reregister"
        with cl.client() as c:
            assert c.generate("Hello again", max_tokens=3).worker == "w"


def test_a_client_kept_across_a_router_restart_is_not_failed_by_the_old_close():
    """The connection closed while the client idled: its next request runs on the
    reconnected socket instead of failing with RouterLost."""
    sim = ["--backend", "sim", "--profile", "gpu-m2", "--warmup", "off", "--heartbeat-s", "0.2"]
    with Cluster(workers=[WorkerSpec("w", sim)]) as cl, cl.client(timeout_s=20.0) as c:
        assert c.generate(tokens=[1, 2, 3], max_tokens=3).worker == "w"
        cl.kill("router")
        time.sleep(0.5)
        cl.start_router()
        cl.wait_for_workers({"w"})
        time.sleep(0.5)  # the client's socket has reconnected meanwhile
        assert c.generate(tokens=[1, 2, 3], max_tokens=3).worker == "w"
