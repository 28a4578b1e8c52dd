"""Is each of ``tandem serve``'s processes up yet? And can it start at all?

The router is up when it answers a ping, the gateway when it answers /health (with
any status: it is up before any worker is), a worker when the router lists it.
"""

from __future__ import annotations

import errno
import socket
import time
import urllib.error
import urllib.request
from typing import Any

from tandem.launcher.plan import Plan

STATUS_EVERY_S = 0.5


class Probes:
    def __init__(self, plan: Plan, keys: str | None) -> None:
        self.plan, self.keys = plan, keys
        self._client: Any = None
        self._workers: dict[str, dict[str, Any]] = {}
        self._polled_s = 0.0
        self._polled_ok = False  # a status has been read
        self.model: str | None = None  # the served model's name, once a worker has said

    def _connect(self) -> Any:
        from tandem.client.sync import Client

        if self._client is None:
            # Short waits: the supervisor's loop asks again; a retry is a fresh socket.
            self._client = Client(
                self.plan.client_addr, timeout_s=2.0, connect_timeout_s=1.0, retries=0,
                keys=self.keys,
            )  # fmt: skip
        return self._client

    def router(self) -> str | None:
        from tandem.client.errors import TandemError

        try:
            self._connect().ping()
        except TandemError:
            return None
        return f"up at {self.plan.client_addr} (workers attach at {self.plan.worker_addr})"

    def gateway(self) -> str | None:
        try:
            urllib.request.urlopen(f"{self.plan.url}/health", timeout=1.0).close()
        except urllib.error.HTTPError:  # 503 before a worker: up all the same
            pass
        except OSError:
            return None
        return f"up at {self.plan.url} (OpenAI API at {self.plan.url}/v1)"

    def worker(self, worker_id: str, started_s: float) -> str | None:
        """Registered by the process started at ``started_s`` (monotonic): the router
        heard from it since (a killed predecessor stays listed until it expires)."""
        self._poll()
        row = self._workers.get(worker_id)
        if row is None or float(row.get("last_seen_s", 0.0)) >= self._polled_s - started_s:
            return None
        self.model = self.model or row.get("model")
        return registered(row)

    def workers(self) -> dict[str, dict[str, Any]] | None:
        """The router's worker rows by id, as of the last status (polled at most every
        STATUS_EVERY_S); None while the router has not answered one."""
        self._poll()
        return self._workers if self._polled_ok else None

    def _poll(self) -> None:
        """One status query per STATUS_EVERY_S, shared by every worker's check."""
        from tandem.client.errors import TandemError

        if time.monotonic() - self._polled_s < STATUS_EVERY_S:
            return
        self._polled_s = time.monotonic()
        try:
            rows = self._connect().status().workers
        except TandemError:
            return
        self._workers = {str(w["id"]): w for w in rows}
        self._polled_ok = True

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


def registered(row: dict[str, Any]) -> str:
    """A worker row of the router's status in words: what it runs on and its rates."""
    prefill = row.get("prefill_tok_s") or 0.0
    decode = row.get("decode_tok_s") or [0.0]
    note = " (provisional: refined while serving)" if row.get("provisional") else ""
    return (
        f"registered: {row.get('backend')} on {row.get('device')}, prefill "
        f"{prefill:.0f} tok/s, decode {decode[0]:.0f} tok/s at batch 1{note}"
    )


def port_problem(plan: Plan, keys: str | None = None) -> tuple[str, str] | None:
    """(process, reason) when an address the plan binds is taken, before anything
    starts: a clear reason now instead of a child's traceback later. The reason says
    whether a tandem router already answers there (another ``tandem serve``), and
    gives the flag that moves this one to a free port."""
    binds = [("router", plan.client_addr, "router.client_addr"),
             ("router", plan.worker_addr, "router.worker_addr"),
             ("gateway", f"tcp://{plan.gateway_bind}", "--port")]  # fmt: skip
    taken: list[tuple[str, str, str, str]] = []  # (process, address, host:port, why)
    moves: list[str] = []  # the flags that move every taken one to a free port
    chosen: set[int] = set()
    for name, addr, change in binds:
        if not addr.startswith("tcp://"):
            continue
        host, _, port = addr.removeprefix("tcp://").rpartition(":")
        host = "0.0.0.0" if host in ("*", "") else host.strip("[]")
        if not port.isdigit() or port == "0":  # no port (ipc://) or any free one
            continue
        why = _bind_problem(host, int(port))
        if why is None:
            continue
        free = _free_port_after(host, int(port), chosen)
        chosen.add(free)
        shown = host if ":" not in host else f"[{host}]"
        moves.append(
            f"--port {free}" if change == "--port" else f"--set {change}=tcp://{shown}:{free}"
        )
        taken.append((name, addr, f"{host}:{port}", why))
    if not taken:
        return None
    name, addr, where, why = taken[0]
    elsewhere = "run this one elsewhere: " + " ".join(moves)
    if addr == plan.client_addr and _tandem_router_at(addr, keys):
        return name, (f"a tandem router already answers at {addr} (another tandem "
                      f"serve? `tandem status` shows it); stop it, or {elsewhere}")  # fmt: skip
    return name, f"cannot listen on {where} ({why}); {elsewhere}"


def _bind_problem(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be bound now, or None."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind
        try:
            s.bind((host, port))
        except OSError as exc:
            return "in use" if exc.errno == errno.EADDRINUSE else exc.strerror
    return None


def _free_port_after(host: str, port: int, chosen: set[int]) -> int:
    """The first port above ``port`` (by tens, then by ones) free on ``host`` now and
    not among ``chosen``."""
    for candidate in [*range(port + 10, port + 100, 10), *range(port + 1, port + 200)]:
        if candidate in chosen or candidate > 65535:
            continue
        if _bind_problem(host, candidate) is None:
            return candidate
    return 0


def _tandem_router_at(addr: str, keys: str | None) -> bool:
    """Whether a tandem router answers at ``addr`` (its refusal of our keys counts)."""
    from tandem.client.errors import HandshakeRefused, TandemError
    from tandem.client.sync import Client

    try:
        with Client(addr, timeout_s=1.0, connect_timeout_s=1.0, retries=0, keys=keys) as c:
            c.status()
    except HandshakeRefused:
        return True
    except TandemError:
        return False
    return True
