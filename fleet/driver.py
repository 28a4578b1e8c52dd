"""``tandem serve --ray ADDRESS``: the driver. It connects to the Ray cluster,
makes the keys, starts the router's actor, keeps one NodeAgent on every live node
(a node that joins gets one within NODES_EVERY_S), tells the agents where the
router is whenever Ray restarts it, and says on the screen what comes and goes.

The actors are not detached: they are Ray's for as long as this driver runs, so
Ctrl-C (or the driver's death) stops every process of the fleet on every node.
"""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import replace
from typing import Any

from tandem.fleet import NAMESPACE, RAY_SERIES, need_ray
from tandem.fleet.actors import NodeAgent, RouterHost
from tandem.fleet.keys import FleetKeys, private_dir, remove
from tandem.fleet.plans import Commands, RouterAddress, short
from tandem.fleet.watch import Registrations
from tandem.launcher.config import ServeConfig
from tandem.launcher.screen import Screen

ROUTER_RESOURCE = "tandem-router"  # a node offering it hosts the router (else the head)
HEAD_RESOURCE = "node:__internal_head__"  # Ray's own marker of the head node
NODES_EVERY_S = 1.0  # how often the node list is read (a joining node waits at most this)
EVENTS_EVERY_S = 1.0  # how often each agent is asked what its processes did
ADDRESS_EVERY_S = 0.1  # how often the router's address is asked while Ray answers at once
START_TIMEOUT_S = 120.0  # the router's actor placed and answering
UNPLACED_NOTE_S = 15.0  # a router unanswered this long: say why it may be
JOIN_NOTE_S = 30.0  # an agent not started this long: said, and ready no longer waits for it
STOP_GRACE_S = 10.0


class FleetError(RuntimeError):
    """Why the fleet cannot start, in words for the user."""


class Fleet:
    def __init__(self, cfg: ServeConfig, address: str, screen: Screen, cmds: Commands) -> None:
        self.cfg, self.address, self.screen = replace(cfg, keys=None), address, screen
        self.cmds = cmds
        self.ray = need_ray()
        self.keys = FleetKeys.new()
        self.agents: dict[str, Any] = {}  # node id -> its NodeAgent handle
        self.expected: dict[str, list[str]] = {}  # node id -> its worker ids
        # node id -> (its agent's first answer, pending; the node; when asked)
        self._joining: dict[str, tuple[Any, dict[str, Any], float]] = {}
        self._slow: set[str] = set()  # joining nodes already said to be slow
        self.router: Any = None
        self.where: RouterAddress | None = None
        self.stop = threading.Event()
        self.client_dir = private_dir("tandem-client-")
        self.watch = Registrations(self.keys.write(self.client_dir / "keys", ("client",)))
        self._address_ref: Any = None
        self._events: dict[str, tuple[Any, int]] = {}  # node id -> (pending ask, last seen)
        self._events_at = 0.0
        self._address_at = 0.0
        self._asked_s = 0.0  # when the pending question about the address was asked
        self._noted = False
        self._ready_s: float | None = None

    # -------------------------------------------------------------- start
    def start(self) -> None:
        ray, t0 = self.ray, time.monotonic()
        self.started_s = t0
        ray.init(address=self.address, namespace=NAMESPACE, log_to_driver=False)
        if not ray.__version__.startswith(RAY_SERIES):
            self.screen.line("note", "ray", f"Ray {ray.__version__}; tandem is tested on "
                             f"{RAY_SERIES}x (pip install 'tandem-serve[ray]')")  # fmt: skip
        try:
            ray.get_actor("router")
            raise FleetError("a tandem fleet already serves on this Ray cluster "
                             "(tandem status --ray shows it); stop it first")  # fmt: skip
        except ValueError:
            pass  # none: ours is the first
        where = self._router_placement()
        self.router = (
            ray.remote(RouterHost)
            .options(name="router", max_restarts=-1, max_task_retries=-1, num_cpus=0, **where)
            .remote(self.cfg, self.keys, self.cmds)
        )
        try:
            self._moved(ray.get(self.router.address.remote(), timeout=START_TIMEOUT_S))
        except ray.exceptions.GetTimeoutError:
            raise FleetError(f"the router's actor was not placed in {START_TIMEOUT_S:.0f} s "
                             f"({where['resources']}): is a node free for it?"
                             ) from None  # fmt: skip
        except ray.exceptions.RayActorError as exc:
            raise FleetError(f"the router's actor could not start: {exc}") from None
        self._reconcile_nodes()

    def _router_placement(self) -> dict[str, Any]:
        offered = any(n["Alive"] and ROUTER_RESOURCE in n["Resources"] for n in self.ray.nodes())
        # A tiny share: only one router, and a node may offer the resource for other uses.
        return {"resources": {ROUTER_RESOURCE if offered else HEAD_RESOURCE: 0.001}}

    # --------------------------------------------------------------- loop
    def run(self) -> int:
        """Serve until SIGINT/SIGTERM; 0 then."""
        signals = (signal.SIGINT, signal.SIGTERM)
        before = {sig: signal.signal(sig, lambda *_: self.stop.set()) for sig in signals}
        nodes_at = time.monotonic() + NODES_EVERY_S
        self.watch.start()
        try:
            while not self.stop.wait(0.05):
                self._follow_router()
                if time.monotonic() >= nodes_at:
                    self._reconcile_nodes()
                    nodes_at = time.monotonic() + NODES_EVERY_S
                self._report()
                self._processes()
            return 0
        finally:
            for sig, handler in before.items():
                signal.signal(sig, handler)

    def _follow_router(self) -> None:
        """Ask where the router is without ever blocking: while Ray restarts its actor
        the question just waits (max_task_retries), and the loop goes on."""
        ray = self.ray
        if self._address_ref is None:
            if time.monotonic() < self._address_at:
                return
            self._address_ref = self.router.address.remote()
            self._address_at = time.monotonic() + ADDRESS_EVERY_S
            self._asked_s, self._noted = time.monotonic(), False
        done, _ = ray.wait([self._address_ref], timeout=0)
        if not done:
            if not self._noted and time.monotonic() - self._asked_s > UNPLACED_NOTE_S:
                self._noted = True
                self.screen.line("down", "router", f"no answer for {UNPLACED_NOTE_S:.0f} s: "
                                 "Ray is restarting it; it needs a live node offering "
                                 f"{ROUTER_RESOURCE} (or the head) to go to")  # fmt: skip
            return
        ref, self._address_ref = self._address_ref, None
        try:
            where: RouterAddress = ray.get(ref)
        except ray.exceptions.RayError:
            return  # dead for good or between lives: asked again next time
        if self.where is None or where.incarnation != self.where.incarnation:
            self._moved(where)

    def _moved(self, where: RouterAddress) -> None:
        first = self.where is None
        self.where = where
        self.watch.point(where)
        for agent in self.agents.values():
            agent.point.remote(where)
        if not first:
            self.screen.line("note", "router", f"restarted on node {short(where.node_id)}: "
                             f"{where.client} (gateway {where.gateway_url})")  # fmt: skip

    def _reconcile_nodes(self) -> None:
        """An agent on every live node; forget those whose node is gone (Ray ends them).
        Every agent hears where the router is again: one Ray restarted (its process
        died, not its node) began from the address it was first given."""
        alive = {n["NodeID"]: n for n in self.ray.nodes() if n["Alive"]}
        for node_id, node in alive.items():
            if node_id not in self.agents:
                self._add_node(node_id, node)
            elif node_id not in self._joining:
                self.agents[node_id].point.remote(self.where)
        for node_id in [n for n in self.agents if n not in alive]:
            self.ray.kill(self.agents.pop(node_id), no_restart=True)
            self._events.pop(node_id, None)
            self._joining.pop(node_id, None)
            self._slow.discard(node_id)
            gone = self.expected.pop(node_id, [])
            left = ", ".join(gone) or "no workers"
            self.screen.line("down", short(node_id), f"node left: {left}")
        self._joined()

    def _add_node(self, node_id: str, node: dict[str, Any]) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        gpus = int(node["Resources"].get("GPU", 0))
        agent = self.ray.remote(NodeAgent).options(
            name=f"node-{node_id}", num_cpus=0, num_gpus=gpus, max_restarts=-1,
            max_task_retries=-1,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        ).remote(self.cfg, self.keys, self.cmds, self.where)  # fmt: skip
        self.agents[node_id] = agent
        # Answered once the agent runs on its node: looked at without waiting (_joined).
        self._joining[node_id] = (agent.point.remote(self.where), node, time.monotonic())

    def _joined(self) -> None:
        """Say each node whose agent has started its workers."""
        for node_id, (ref, node, asked_s) in list(self._joining.items()):
            if not self.ray.wait([ref], timeout=0)[0]:
                if asked_s + JOIN_NOTE_S <= time.monotonic() and node_id not in self._slow:
                    self._slow.add(node_id)
                    self.screen.line("note", short(node_id), f"its agent has not started in "
                                     f"{JOIN_NOTE_S:.0f} s: are its GPUs taken by other Ray "
                                     "work? (it holds them all)")  # fmt: skip
                continue
            del self._joining[node_id]
            try:
                ids: list[str] = self.ray.get(ref)
            except self.ray.exceptions.RayError as exc:
                self.screen.line("down", short(node_id), f"its agent failed: {exc}")
                continue
            self.expected[node_id] = ids
            gpus = int(node["Resources"].get("GPU", 0))
            ip = node.get("NodeManagerAddress", "?")
            what = f"{len(ids)} workers: {', '.join(ids)}"
            self.screen.line("up", short(node_id), f"node joined ({ip}, {gpus} GPU): {what}")

    def _processes(self) -> None:
        """Show what each node's processes did (exits, restarts, a failing one's last
        log lines): a node's logs reach the head this way. Never blocks."""
        if time.monotonic() < self._events_at:
            return
        self._events_at = time.monotonic() + EVENTS_EVERY_S
        for key, actor in [*self.agents.items(), ("router", self.router)]:
            ref, seen = self._events.get(key, (None, 0))
            if ref is not None:
                if not self.ray.wait([ref], timeout=0)[0]:
                    continue
                try:
                    upto, lines = self.ray.get(ref)
                except self.ray.exceptions.RayError:
                    upto, lines = seen, []
                # A restarted actor counts from 0 again: read it from its start.
                seen = upto if upto >= seen else 0
                for line in lines:
                    if " started (pid" not in line:  # starts are said by registrations
                        self.screen.line("note", short(key), line)
            self._events[key] = (actor.events_since.remote(seen), seen)

    def _report(self) -> None:
        for kind, wid, text in self.watch.changes():
            self.screen.line(kind, wid, text)
        # Ready once every node there at the start has its workers registered (those
        # whose agent is not placed in JOIN_NOTE_S are not waited for).
        slow = all(t + JOIN_NOTE_S < time.monotonic() for _, _, t in self._joining.values())
        if self._ready_s is None and self.where is not None and self.expected and slow:
            have = self.watch.registered()
            if all(any(w in have for w in ids) for ids in self.expected.values() if ids):
                self._ready_s = time.monotonic() - self.started_s
                self._ready()

    def _ready(self) -> None:
        assert self.where is not None
        out, where = self.screen.console, self.where
        out.print(f"ready: {where.gateway_url}/v1 (in {self._ready_s:.1f} s)", markup=False)
        rows = [
            ("nodes", ", ".join(short(n) for n in self.expected)),
            ("workers", ", ".join(w for ids in self.expected.values() for w in ids)),
            ("OpenAI API", f"{where.gateway_url}/v1"),
            (
                "router",
                f"{where.client} on node {short(where.node_id)} "
                f"(tandem status --ray {self.address})",
            ),  # fmt: skip
            ("logs", "each node's agent keeps its processes' logs (docs/DEPLOY.md)"),
        ]
        for key, value in rows:
            out.print(f"  {key:<11} {value}", markup=False)
        out.print("Ctrl-C stops every process on every node.", style="dim", markup=False)

    # --------------------------------------------------------------- stop
    def close(self) -> None:
        """Workers first (their Goodbyes reach the router), then the router; every
        actor killed at the end whatever it answered."""
        ray = self.ray
        self.watch.stop()
        if ray.is_initialized():
            agents = list(self.agents.values())
            ray.wait([a.shutdown.remote() for a in agents], num_returns=len(agents),
                     timeout=STOP_GRACE_S)  # fmt: skip
            if self.router is not None:
                ray.wait([self.router.shutdown.remote()], timeout=STOP_GRACE_S)
            for actor in [*agents, self.router]:
                if actor is not None:
                    ray.kill(actor, no_restart=True)
            ray.shutdown()
        remove(self.client_dir)


def serve_on_ray(cfg: ServeConfig, address: str, screen: Screen, cmds: Commands) -> int:
    """Serve ``cfg`` on the Ray cluster at ``address`` until a signal; ``cmds``: the
    router, worker and gateway commands (their parsers check every flag)."""
    fleet = Fleet(cfg, address, screen, cmds)
    try:
        fleet.start()
        return fleet.run()
    finally:
        fleet.close()
