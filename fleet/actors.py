"""The fleet's two actors. Each keeps a few ``tandem`` subprocesses running on its
node (fleet/process.py) from one supervision thread, and answers the driver.

- ``RouterHost``: the router and the gateway, on the head or a node offering the
  ``tandem-router`` resource. Ray restarts it (on another node if its node is
  gone); a router process that merely exits is restarted here, on the same ports.
- ``NodeAgent``: one per node, pinned to it: a worker per device (the CPU, each
  GPU Ray gave it), pointed at wherever the router is now (``point``).

They are plain classes: the driver makes them actors with ``ray.remote`` at run
time, so importing this module needs no Ray. The process commands (``cmds``) come
from the CLI through their constructors, as launcher/plan.py takes them: the fleet
sits below the CLI.
"""

from __future__ import annotations

import collections
import contextlib
import socket
import threading
import time
import uuid
from typing import Any

from tandem.fleet import need_ray
from tandem.fleet.keys import FleetKeys, KeyPair, private_dir, remove
from tandem.fleet.plans import Commands, RouterAddress, host_plan, router_ports, worker_plan
from tandem.fleet.process import Managed
from tandem.launcher.config import ServeConfig
from tandem.launcher.plan import Proc
from tandem.workers.follow import write_address

TICK_S = 0.1  # how often the supervision thread looks at its processes
EVENTS_KEPT = 200


class _Host:
    """What both actors share: a private folder, the processes, their events."""

    def __init__(self, prefix: str) -> None:
        ray = need_ray()
        self.node_id: str = ray.get_runtime_context().get_node_id()
        self.dir = private_dir(prefix)
        self.procs: dict[str, Managed] = {}
        self.events: collections.deque[tuple[int, str]] = collections.deque(maxlen=EVENTS_KEPT)
        self._seq = 0
        self._wanted: list[Proc] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._supervise, name="tandem-fleet", daemon=True)
        self._thread.start()

    def _want(self, procs: list[Proc]) -> None:
        """Run exactly ``procs`` from now on (the supervision thread swaps them)."""
        with self._lock:
            self._wanted = procs

    def _supervise(self) -> None:
        # Every process is started and stopped on this thread (process.py: PDEATHSIG).
        while not self._stop.wait(TICK_S):
            with self._lock:
                wanted, self._wanted = self._wanted, None
            if wanted is not None:
                self._swap(wanted)
            now = time.monotonic()
            for m in self.procs.values():
                event = m.check(now)
                if event and event.startswith("exited") and m.popen and m.popen.returncode:
                    event += f"; its last lines (on node {self.node_id[:8]}):\n{m.tail(8)}"
                if event:
                    self._note(f"{m.name} {event}")
        for m in self.procs.values():
            m.stop()

    def _swap(self, procs: list[Proc]) -> None:
        for m in self.procs.values():
            m.stop()
        self.procs = {}
        for p in procs:
            m = Managed(p.name, p.argv, dict(p.env), self.dir / f"{p.name}.log")
            m.start()
            self.procs[p.name] = m
            self._note(f"{p.name} started (pid {m.pid})")

    def _note(self, text: str) -> None:
        self._seq += 1
        self.events.append((self._seq, f"{time.strftime('%H:%M:%S')} {text}"))

    # ----------------------------------------------------- what the driver asks
    def processes(self) -> list[dict[str, Any]]:
        """Each process: name, pid, alive, restarts."""
        return [{"name": m.name, "pid": m.pid, "alive": m.alive(), "restarts": m.restarts}
                for m in list(self.procs.values())]  # fmt: skip

    def tail(self, name: str, lines: int = 40) -> str:
        """The last lines of one process's log (how the head reads a node's logs)."""
        m = self.procs.get(name)
        return m.tail(lines) if m is not None else ""

    def events_since(self, seq: int) -> tuple[int, list[str]]:
        """What happened to the processes after event ``seq`` (the driver shows it):
        the next ``seq`` to ask from, and the events (the last EVENTS_KEPT at most)."""
        return self._seq, [text for n, text in list(self.events) if n > seq]

    def shutdown(self) -> None:
        """Stop every process (workers say Goodbye) and remove the private folder."""
        self._stop.set()
        self._thread.join(timeout=15.0)
        remove(self.dir)


class RouterHost(_Host):
    def __init__(self, cfg: ServeConfig, keys: FleetKeys, cmds: Commands) -> None:
        super().__init__("tandem-router-")
        ray = need_ray()
        self.keys = keys
        folder = keys.write(self.dir / "keys", ("router", "client"))
        ip: str = ray.util.get_node_ip_address()
        ports = tuple(p or _free_port(ip) for p in router_ports(cfg))
        plan = host_plan(cfg, self.node_id, ip, (ports[0], ports[1]), folder, cmds)
        host, _, port = plan.gateway_bind.rpartition(":")
        url_host = ip if host in ("0.0.0.0", "::", "") else host
        self.where = RouterAddress(plan.client_addr, plan.worker_addr, f"http://{url_host}:{port}",
                                   self.node_id, uuid.uuid4().hex[:8])  # fmt: skip
        self._want(list(plan.procs))

    def address(self) -> RouterAddress:
        return self.where

    def access(self) -> tuple[RouterAddress, FleetKeys]:
        """What a client (tandem status/top --ray) needs: the address, the router's
        public key and the client key pair; no other secret."""
        k = self.keys
        return self.where, FleetKeys(KeyPair(k.router.public, ""), KeyPair("", ""), k.client)

    def router_pid(self) -> int | None:
        m = self.procs.get("router")
        return m.pid if m is not None else None


class NodeAgent(_Host):
    def __init__(
        self, cfg: ServeConfig, keys: FleetKeys, cmds: Commands, router: RouterAddress | None
    ) -> None:
        super().__init__("tandem-node-")
        ray = need_ray()
        self.cfg, self.cmds = cfg, cmds
        self.keys_dir = keys.write(self.dir / "keys", ("worker",))
        self.router_file = self.dir / "router"
        self.gpu_ids = [str(g) for g in ray.get_gpu_ids()]
        self.router: RouterAddress | None = None
        self.ids: list[str] = []
        if router is not None:
            self.point(router)

    def point(self, router: RouterAddress) -> list[str]:
        """Point this node's workers at ``router``: the first time, start them; later,
        rewrite the address file they follow (workers/follow.py), so they re-register
        with a router that moved without restarting. Returns the worker ids."""
        before, self.router = self.router, router
        if before is not None:  # the workers run: at most a new address for them
            if before.worker != router.worker:
                write_address(self.router_file, router.worker)
            return self.ids
        write_address(self.router_file, router.worker)
        procs = worker_plan(self.cfg, self.node_id, self.gpu_ids, router.worker,
                            self.router_file, self.keys_dir, self.cmds)  # fmt: skip
        self.ids = [p.name for p in procs]
        self._want(procs)
        return self.ids


def _free_port(ip: str) -> int:
    with contextlib.closing(socket.socket()) as s:
        s.bind((ip, 0))
        return int(s.getsockname()[1])
