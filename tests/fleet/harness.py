"""A local Ray cluster and a ``tandem serve --ray`` on it, for the fleet tests. Only
usable inside a network namespace of the test's own with only loopback up: there
Ray advertises 127.0.0.1 (test_namespace.py runs these tests that way)."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil

SIM = ["--set", "worker.backend='sim'", "--set", "worker.profile='cpu-m2'",
       "--set", "worker.warmup='off'", "--set", "worker.heartbeat_s=0.2"]  # fmt: skip
# Ray notices a node that vanished within ~1 s here (defaults: tens of seconds).
FAST_HEALTH = {"health_check_period_ms": 200, "health_check_failure_threshold": 3,
               "health_check_initial_delay_ms": 0}  # fmt: skip


# What a request meets while the gateway or router is away: refused, reset, cut off.
NO_SERVICE = (OSError, http.client.HTTPException)


def private_netns() -> bool:
    """True inside a network namespace whose only interface is loopback."""
    return [name for _, name in socket.if_nameindex()] == ["lo"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _processes_of(node_id: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.environ().get("TANDEM_NODE") == node_id:
                found.append(proc)
    return found


class LocalRay:
    """A head and ``nodes`` more, one CPU each; ``router`` nodes offer tandem-router."""

    def __init__(self, nodes: int = 2, router_on: tuple[int, ...] = ()) -> None:
        from ray.cluster_utils import Cluster

        head = {"num_cpus": 1, "_system_config": FAST_HEALTH}
        self.cluster = Cluster(initialize_head=True, head_node_args=head)
        self.nodes = [self.add(router=i in router_on) for i in range(nodes)]
        self.cluster.wait_for_nodes()
        self.address = self.cluster.address

    def add(self, router: bool = False) -> Any:
        resources = {"tandem-router": 1} if router else {}
        return self.cluster.add_node(num_cpus=1, resources=resources)

    def remove(self, node: Any) -> None:
        """The node is lost, as a machine that vanishes: Ray's processes and every
        tandem process on it (TANDEM_NODE) at once. Ray alone would leave actors'
        children running until they notice their raylet gone."""
        doomed = _processes_of(node.node_id)
        self.cluster.remove_node(node, allow_graceful=False)
        for proc in doomed:
            with contextlib.suppress(psutil.Error):
                proc.kill()

    def shutdown(self) -> None:
        self.cluster.shutdown()


class Serve:
    """``tandem serve --ray ADDRESS`` with sim workers; its stdout lines queued."""

    def __init__(self, address: str, *args: str, log: Path) -> None:
        self.port = free_port()
        argv = [sys.executable, "-m", "tandem", "serve", "--ray", address,
                "--port", str(self.port), *SIM, *args]  # fmt: skip
        self.log = log
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     env={**os.environ, "COLUMNS": "200"})  # fmt: skip
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with open(self.log, "a") as out:
            for raw in self.proc.stdout:
                line = raw.decode(errors="replace").rstrip()
                out.write(line + "\n")
                out.flush()
                self.lines.put(line)

    def wait_for(self, text: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            self.seen.append(line)
            if text in line:
                return line
        raise AssertionError(f"no {text!r} in {timeout_s} s; serve said:\n" + "\n".join(self.seen))

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def model(url: str) -> str:
    with urllib.request.urlopen(f"{url}/v1/models", timeout=10.0) as resp:
        return str(json.loads(resp.read())["data"][0]["id"])


def chat(url: str, text: str, max_tokens: int = 16, stream: bool = False,
         timeout_s: float = 60.0) -> Any:  # fmt: skip
    """One chat completion; a stream comes back as its chunks."""
    body = {"model": model(url), "messages": [{"role": "user", "content": text}],
            "max_tokens": max_tokens, "stream": stream}  # fmt: skip
    req = urllib.request.Request(f"{url}/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        if not stream:
            return json.loads(resp.read())
        chunks = []
        for raw in resp:
            line = raw.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
        return chunks
