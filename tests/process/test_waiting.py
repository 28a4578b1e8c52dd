"""Waiting is explained (issue 30), as real processes: with no router at the address
the CLI and the gateway say so and name `tandem serve`; with a router whose worker
is still starting, /health and /v1/models say "starting", and a request sent then
(by `tandem generate`, which says what it waits for, and through the gateway) waits
for the worker and completes. Plus `tandem --version` and `tandem status` on stdout."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
import threading
import time

import pytest

from tandem.launcher.cluster import Cluster, WorkerSpec
from tests.helpers import LLAMA_ARGS, needs_llama
from tests.process.test_gateway import call, sdk

pytestmark = pytest.mark.timeout(300)
NO_HANG_S = 20.0  # the CLI's error comes in ~1.5 s (1 s of it the client's wait)
ALIAS = "smol"  # the name the gateway is told to serve under before a worker says its own


def tandem(*args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "tandem", *args], capture_output=True, text=True, timeout=120
    )
    return out, time.monotonic() - t0


def test_no_router_is_named_by_the_cli_and_the_gateway():
    cl = Cluster(transport="tcp")  # never started: nothing listens at its address
    try:
        for args in (["status"], ["generate", "hi"], ["top", "--once"]):
            out, took_s = tandem(*args, "--router", cl.client_addr)
            assert out.returncode == 1 and out.stdout == "", out
            assert "router_unavailable" in out.stderr and cl.client_addr in out.stderr
            assert "tandem serve" in out.stderr and took_s < NO_HANG_S
        url = cl.start_gateway()  # it starts all the same: a router may come
        status, body = call(f"{url}/health")
        assert status == 503 and body["status"] == "unavailable"
        assert cl.client_addr in body["reason"]
        chat = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        status, body = call(f"{url}/v1/chat/completions", chat.encode())
        assert status == 503 and body["error"]["code"] == "router_unavailable"
        assert "tandem serve" in body["error"]["message"]
        assert "no router at" in cl.log("gateway")
    finally:
        cl.__exit__()


def _wait_for_line(stream, needle: str, timeout_s: float) -> list[str]:
    """Lines of ``stream`` up to the first one holding ``needle``."""
    lines: list[str] = []
    done = threading.Event()

    def read() -> None:
        for line in stream:
            lines.append(line)
            if needle in line:
                done.set()
                return

    threading.Thread(target=read, daemon=True).start()
    assert done.wait(timeout_s), lines
    return lines


@needs_llama
@pytest.mark.model
def test_a_request_sent_while_the_worker_starts_waits_for_it():
    with Cluster(router_args=["--no-worker-wait-s", "240"]) as cl:
        url = cl.start_gateway("gateway", ("--model-alias", ALIAS))
        status, body = call(f"{url}/health")
        assert status == 503 and body["status"] == "starting"
        models = sdk(url).models.list()
        assert [m.id for m in models.data] == [ALIAS]  # the README's data[0] works
        assert models.data[0].model_extra["status"] == "starting"
        gen = subprocess.Popen(
            [sys.executable, "-m", "tandem", "generate", "Name a color.", "--max-tokens", "4",
             "--router", cl.client_addr],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        answers: list[object] = []
        chat = threading.Thread(
            target=lambda: answers.append(
                sdk(url).chat.completions.create(
                    model=ALIAS, messages=[{"role": "user", "content": "hi"}], max_tokens=4
                )
            )
        )
        chat.start()
        try:
            # The worker starts only once the CLI has said what it waits for.
            said = _wait_for_line(gen.stderr, "waiting for a worker to register", 60)
            cl.start_worker(WorkerSpec("cpu0", LLAMA_ARGS))
            out, err = gen.communicate(timeout=180)
        finally:
            gen.kill()
        assert gen.returncode == 0 and out.strip(), "".join(said) + err
        chat.join(180)
        assert answers and answers[0].choices[0].message.content  # type: ignore[attr-defined]
        assert answers[0].model == ALIAS  # type: ignore[attr-defined]
        status, body = call(f"{url}/health")
        assert status == 200 and body["status"] == "ok"
        statuses = {m.id: m.model_extra["status"] for m in sdk(url).models.list().data}
        assert statuses[ALIAS] == "ready" and len(statuses) == 2  # and the worker's name
        table, _ = tandem("status", "--router", cl.client_addr)
        assert table.returncode == 0 and "cpu0" in table.stdout and table.stderr == ""


@needs_llama
@pytest.mark.model
def test_the_waiting_line_names_the_starting_worker_its_stage_and_time_left(tmp_path, monkeypatch):
    """A worker announces itself as soon as it starts (Starting): the CLI's waiting
    line, `tandem status` and the gateway's /health name it while it loads and
    measures itself; the request then completes on it. A cache of its own, as on a
    machine's first start: the worker chooses its weights format and measures itself,
    seconds in which the CLI starts and waits."""
    monkeypatch.setenv("TANDEM_CACHE_DIR", str(tmp_path))
    args = [a for a in LLAMA_ARGS if a not in ("--warmup", "off")] + ["--warmup", "quick"]
    with Cluster(router_args=["--no-worker-wait-s", "240"]) as cl:
        url = cl.start_gateway("gateway", ("--model-alias", ALIAS))
        cl.start_worker(WorkerSpec("cpu0", args), wait=False)
        starting = _until(lambda: _starting_health(url), 60)  # before the request: no race
        assert starting["starting"][0]["id"] == "cpu0" and "cpu0 (" in starting["reason"]
        gen = subprocess.Popen(
            [sys.executable, "-m", "tandem", "generate", "Name a color.", "--max-tokens", "4",
             "--router", cl.client_addr],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            out, err = gen.communicate(timeout=180)
        finally:
            gen.kill()
        assert gen.returncode == 0 and out.strip(), err
        first = err.splitlines()[0]
        assert first.startswith("waiting for worker cpu0 ("), err
        assert any(s in first for s in ("loading its model", "measuring itself", "ready soon"))
        status, body = call(f"{url}/health")
        assert status == 200 and body["status"] == "ok"


def _starting_health(url: str) -> dict | None:
    status, body = call(f"{url}/health")
    return body if status == 503 and body.get("starting") else None


def _until(probe, timeout_s: float):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = probe()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout_s} s")


def test_version_is_the_installed_package_version():
    out, _ = tandem("--version")
    assert out.returncode == 0
    assert out.stdout.split()[-1] == importlib.metadata.version("tandem-serve")
