"""A worker's start, as real processes see it: its progress lines, its provisional
prices, a request that was waiting for it, and a second worker under a taken id.

The router is a real process (``Cluster`` with no workers); workers are started
here so their stdout (``--progress-json``) can be read apart from their log.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tandem.launcher.cluster import Cluster
from tests.helpers import needs_llama

WAIT_S = 120.0  # bounds on waiting, never timing claims: this machine is shared
SIM = ["--backend", "sim", "--profile", "cpu-m2", "--max-active", "2", "--heartbeat-s", "0.2"]


def spawn(cl: Cluster, worker_id: str, args: list[str], log: Path) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "tandem", "worker", "--router", cl.worker_addr,
           "--worker-id", worker_id, "--progress-json", *args]  # fmt: skip
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log.open("w"), text=True)


def events(proc: subprocess.Popen[str], until: str) -> list[dict]:
    """Its progress lines up to and including the first ``until`` event (or its end)."""
    assert proc.stdout is not None
    seen: list[dict] = []
    for line in proc.stdout:
        seen.append(json.loads(line))  # every stdout line is one JSON object
        if seen[-1]["event"] == until:
            break
    return seen


def status_row(cl: Cluster, worker_id: str) -> dict:
    with cl.client(timeout_s=10.0) as c:
        return next(w for w in c.status().workers if w["id"] == worker_id)


def stop(*procs: subprocess.Popen[str]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


@needs_llama
@pytest.mark.model
def test_a_request_sent_before_any_worker_completes_on_a_quickly_measured_one(
    tmp_path, monkeypatch
) -> None:
    """No worker yet: the request waits at the router (no_worker_wait_s). The worker,
    with no stored profile, measures itself quickly, says so line by line, registers
    provisional, serves the request, and its served steps then bear its prices out."""
    monkeypatch.setenv("TANDEM_CACHE_DIR", str(tmp_path))  # no stored profile anywhere
    with Cluster(router_args=["--no-worker-wait-s", "120"]) as cl:
        out: dict = {}

        def ask() -> None:
            with cl.client(timeout_s=WAIT_S) as c:
                out["result"] = c.generate("Count to ten:", max_tokens=48, ignore_eos=True)

        asker = threading.Thread(target=ask)
        asker.start()
        time.sleep(0.5)  # the request is at the router before the worker process exists
        worker = spawn(cl, "cpu0", ["--threads", "1", "--n-ctx", "4096"], tmp_path / "cpu0.log")
        try:
            seen = events(worker, until="registered")
            asker.join(timeout=WAIT_S)
            assert not asker.is_alive() and "result" in out
            assert len(out["result"].token_ids) == 48
            deadline = time.monotonic() + WAIT_S
            while status_row(cl, "cpu0")["provisional"] and time.monotonic() < deadline:
                time.sleep(0.5)
            row = status_row(cl, "cpu0")
        finally:
            stop(worker)
    kinds = [e["event"] for e in seen]
    assert kinds[0] == "loading" and kinds[-1] == "registered", kinds
    measuring = [e for e in seen if e["event"] == "measuring"]
    assert measuring and measuring[-1]["done"] == measuring[-1]["total"]
    assert [e["done"] for e in measuring] == sorted(e["done"] for e in measuring)
    assert seen[-1] == {"event": "registered", "worker_id": "cpu0", "provisional": True}
    assert not row["provisional"] and row["live_steps"] >= 32, row  # borne out by served steps
    log = (tmp_path / "cpu0.log").read_text()
    assert "measuring cpu quickly" in log and "rough default" not in log


def test_a_second_worker_under_a_taken_id_is_refused_by_name_and_a_restart_is_not(
    tmp_path,
) -> None:
    """cpu0 serves; a second process claiming cpu0 is told so (both logs name the id
    and the holder) and exits non-zero. Once the first one dies, a restart under the
    same id registers."""
    with Cluster(router_args=["--no-worker-wait-s", "0"]) as cl:
        first = spawn(cl, "cpu0", SIM, tmp_path / "first.log")
        second = restart = None
        try:
            assert events(first, until="registered")[-1]["event"] == "registered"
            second = spawn(cl, "cpu0", SIM, tmp_path / "second.log")
            assert second.wait(timeout=WAIT_S) != 0
            (error,) = [e for e in events(second, until="error") if e["event"] == "error"]
            first.kill()
            first.wait(timeout=30)
            restart = spawn(cl, "cpu0", SIM, tmp_path / "restart.log")
            assert events(restart, until="registered")[-1]["event"] == "registered"
            assert restart.poll() is None and status_row(cl, "cpu0")
            router_log = cl.log("router")
        finally:
            stop(*(x for x in (first, second, restart) if x is not None))
    for text in (error["message"], (tmp_path / "second.log").read_text(), router_log):
        assert "'cpu0' is taken by a live worker (sim on" in text, text
    assert "refusing worker cpu0" in router_log
