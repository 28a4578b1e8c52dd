"""Start a whole tandem cluster (router + workers) as real processes, and stop it.

Used by the tests and by ``tandem bench``; the same processes ``honcho start``
runs from the Procfile, with their addresses chosen so that several clusters can
coexist (ipc:// paths in a private directory, or free TCP ports).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tandem.client.errors import TandemError
from tandem.client.sync import Client


def free_tcp_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_tcp_address() -> str:
    return f"tcp://127.0.0.1:{free_tcp_port()}"


@dataclass
class WorkerSpec:
    """One worker process: its id and the extra ``tandem worker`` flags."""

    worker_id: str
    args: list[str] = field(default_factory=list)


@dataclass
class Cluster:
    workers: list[WorkerSpec] = field(default_factory=list)
    router_args: list[str] = field(default_factory=list)
    transport: str = "ipc"  # or "tcp"
    log_dir: Path | None = None
    start_timeout_s: float = 60.0
    keys: str | None = None  # CURVE keys folder for every process and client (`tandem keys`)

    def __post_init__(self) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="tandem-")
        root = Path(self._tmp.name)
        self.log_dir = self.log_dir or root
        if self.transport == "ipc":
            self.client_addr, self.worker_addr = f"ipc://{root}/c.sock", f"ipc://{root}/w.sock"
        else:
            self.client_addr, self.worker_addr = free_tcp_address(), free_tcp_address()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    # ------------------------------------------------------------ processes
    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        assert self.log_dir is not None
        log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - owned by the child
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        proc = subprocess.Popen(
            [sys.executable, "-m", "tandem", *args], stdout=log, stderr=log, env=env
        )
        self.procs[name] = proc
        return proc

    def start_router(self) -> None:
        self._spawn(
            "router",
            [
                "router",
                "--client-addr",
                self.client_addr,
                "--worker-addr",
                self.worker_addr,
                *self._keys_args(),
                *self.router_args,
            ],
        )

    def start_worker(self, spec: WorkerSpec, wait: bool = True) -> None:
        self._spawn(
            spec.worker_id,
            [
                "worker",
                "--router",
                self.worker_addr,
                "--worker-id",
                spec.worker_id,
                *self._keys_args(),
                *spec.args,
            ],
        )
        if wait:
            self.wait_for_workers({spec.worker_id})

    def _keys_args(self) -> list[str]:
        return ["--keys", self.keys] if self.keys else []

    def start(self) -> Cluster:
        """Start the router and every worker; on any failure stop what started (a
        half-started cluster must not outlive its caller), then re-raise."""
        try:
            self.start_router()
            for spec in self.workers:
                self.start_worker(spec, wait=False)
            self.wait_for_workers({w.worker_id for w in self.workers})
        except BaseException:
            self.stop()
            raise
        return self

    def wait_for_workers(self, ids: set[str]) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        have: set[str] = set()
        with self.client(timeout_s=5.0) as c:
            while time.monotonic() < deadline:
                try:
                    have = {w["id"] for w in c.status().workers}
                except TandemError:  # not listening yet: with no worker asked, wait too
                    have = set()
                else:
                    if ids <= have:
                        return
                for name, proc in self.procs.items():
                    if proc.poll() is not None:
                        raise RuntimeError(
                            f"{name} exited with {proc.returncode}: {self.log(name)}"
                        )
                time.sleep(0.1)
        # The log folder goes with the cluster: say what the processes said.
        tails = "\n".join(f"--- {name}:\n{self.log(name)[-1500:]}" for name in self.procs)
        raise TimeoutError(f"workers {sorted(ids - have)} did not register:\n{tails}")

    def start_gateway(self, name: str = "gateway", args: tuple[str, ...] = ()) -> str:
        """Start ``tandem gateway`` in front of this router; returns its base URL once it
        answers /health (with any status: it may be up before any worker is)."""
        port = free_tcp_port()
        self._spawn(name, ["gateway", "--router", self.client_addr, "--port", str(port), *args])
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"{url}/health", timeout=2.0).close()
                return url
            except urllib.error.HTTPError:  # 503 before a worker: it is up all the same
                return url
            except OSError:
                if self.procs[name].poll() is not None:
                    raise RuntimeError(f"{name} exited: {self.log(name)}") from None
                time.sleep(0.1)
        raise TimeoutError(f"{name} did not answer on {url}: {self.log_dir}")

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        proc = self.procs.pop(name)
        proc.send_signal(sig)
        proc.wait(timeout=10)

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM every process (workers first, so their Goodbyes reach the router),
        wait for all of them together for ``grace_s``, SIGKILL what is left."""
        order = sorted(self.procs, key=lambda name: name == "router")
        for name in order:
            if self.procs[name].poll() is None:
                self.procs[name].send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for name in order:
            proc = self.procs[name]
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()

    def log(self, name: str) -> str:
        assert self.log_dir is not None
        path = self.log_dir / f"{name}.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def client(self, timeout_s: float = 300.0) -> Client:
        return Client(self.client_addr, timeout_s=timeout_s, keys=self.keys)

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self._tmp.cleanup()
