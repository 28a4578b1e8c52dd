"""The router process's loop: two sockets, one poller, the router core driven by them.

Two ROUTER sockets: clients connect to one, workers to the other. Everything the
router decides is in ``RouterCore`` (broker/core.py), which knows no socket and no
clock; this loop reads frames, decodes them behind one boundary (anything
malformed becomes a refused frame the core answers, and nothing a peer sends may
raise out of a turn), hands them to the core with the time, and sends what the
core owes its peers at the end of each phase of a turn through the core's one
flush (``RouterCore.flush``, this loop its ``Peers``), one frame per peer: its
cost is per frame. The addresses it binds are its own, not the core's config.
It also owns what is about time and threads:
the adaptive spin (broker/spin.py), gathering idle heartbeats, freezing the
long-lived state out of the collector, and the pool that tokenizes large prompts
beside the loop (broker/tokenize.py).
"""

from __future__ import annotations

import gc
import logging
import math
import threading
import time
from typing import Any

import zmq

from tandem.broker.admission import WORKER_FRAME_BYTES
from tandem.broker.config import RouterConfig
from tandem.broker.core import RouterCore
from tandem.broker.decisions import DecisionLog
from tandem.broker.outgoing import Held, Lost, Records
from tandem.broker.spin import AdaptiveSpin
from tandem.broker.tokenize import Tokenizing
from tandem.common import auth
from tandem.common.peerlimit import TRACKED, PeerLimit, drain
from tandem.common.settings import Addresses
from tandem.common.transport import RouterSocket, close_monitor, monitor_socket

__all__ = ["Router", "RouterConfig"]

log = logging.getLogger(__name__)

# With nothing in flight, worker frames (heartbeats, mostly repeats) wait this long to
# be read together; a client still wakes the router at once, and its first turn reads
# every waiting worker frame before it routes. An idle fleet's CPU falls with the wait
# and flattens by here (docs/results/router-overhead.md).
IDLE_GATHER_MS = 200
# Client bytes read per turn: a turn that read every waiting large Submit held every
# stream's tokens for all their decoding (docs/results/reliability.md).
CLIENT_TURN_BYTES = 1 << 20


class Router:
    """The live router: ``RouterCore`` behind two sockets bound at ``addresses``
    (``serve`` runs it)."""

    def __init__(self, cfg: RouterConfig, addresses: Addresses) -> None:
        self.cfg = cfg
        adm = cfg.admission
        peers = PeerLimit(cfg.max_connections_per_address)
        self.guard = auth.RouterGuard.start(cfg.keys, addresses, peers)
        self.peers = peers
        self.client_sock = RouterSocket(
            addresses.client, adm.max_frame_bytes, self.guard.setup("clients")
        )
        self.worker_sock = RouterSocket(
            addresses.worker, WORKER_FRAME_BYTES, self.guard.setup("workers")
        )
        # Connections opened and closed: liveness probes workers on a close; both
        # sockets' count per peer address (common/peerlimit.py).
        self._monitor = monitor_socket(self.worker_sock.sock, TRACKED)
        self._client_monitor = monitor_socket(self.client_sock.sock, TRACKED)
        self.tokenizing = Tokenizing()  # large prompts, tokenized beside the loop
        self.core = RouterCore(cfg, offload=self.tokenizing, cost_clock=time.perf_counter,
                               wall_clock=time.time)  # fmt: skip
        peers.on_refused = self.core.metrics.on_connection_refused
        self.decision_log = DecisionLog(cfg.decision_log, time.time) if cfg.decision_log else None
        self.spin = AdaptiveSpin(cfg.spin_us / 1e6)

    # ------------------------------------------------------------ loop
    def serve(self, stop: threading.Event) -> None:
        core = self.core
        poller = zmq.Poller()
        poller.register(self.client_sock.sock, zmq.POLLIN)
        poller.register(self.worker_sock.sock, zmq.POLLIN)
        log.info("router: clients on %s, workers on %s, policy %s", self.client_sock.address,
                 self.worker_sock.address, core.policy.name)  # fmt: skip
        poller.register(self._monitor, zmq.POLLIN)
        poller.register(self._client_monitor, zmq.POLLIN)
        poller.register(self.tokenizing.fd, zmq.POLLIN)
        client_wake = zmq.Poller()
        client_wake.register(self.client_sock.sock, zmq.POLLIN)
        more, frozen_at = False, -1
        ready: dict[Any, int] | None  # the sockets a poll found readable (None: read all)
        try:
            while not stop.is_set():
                if len(core.workers) != frozen_at:
                    # Long-lived state (workers, their cached views) leaves the cyclic
                    # collector's reach: full collections over it, triggered by the
                    # short-lived objects of each request, cost more than a decision.
                    gc.freeze()
                    frozen_at = len(core.workers)
                ready = dict(poller.poll(timeout=0)) if more else self._wait(poller)
                idle = not (more or core.requests or core.pending or core.tokenizing)
                if idle and self.client_sock.sock not in ready:
                    # Idle, woken by heartbeats: let them gather for a moment, waking
                    # at once for a client: one turn then handles many, and the
                    # per-turn and cold-cache costs are shared. (A client already
                    # waiting is served now: reading every socket again, and a second
                    # poll, cost a lone request ~15 us.)
                    client_wake.poll(timeout=IDLE_GATHER_MS)
                    ready = None  # anything may have come meanwhile
                start = time.monotonic()
                more = self.turn(None if more else ready)
                core.liveness.turn_took(start, time.monotonic())
        finally:
            self.close()

    def close(self) -> None:
        close_monitor(self.worker_sock.sock, self._monitor)
        close_monitor(self.client_sock.sock, self._client_monitor)
        self.client_sock.close()
        self.worker_sock.close()
        self.guard.stop()
        self.tokenizing.close()
        if self.decision_log:
            self.decision_log.close()

    def _wait(self, poller: zmq.Poller) -> dict[Any, int]:
        """The sockets with input: polled without sleeping for the spin window
        (broker/spin.py), then waited for until ``_poll_ms``."""
        start = time.monotonic()
        window = self.spin.window_s
        if window:  # no longer than a held Accepted may wait (_poll_ms)
            deadline = start + min(window, self._poll_ms() / 1e3)
            while True:
                ready = dict(poller.poll(timeout=0))
                if ready:
                    traffic = self._traffic(ready)
                    self.spin.waited(time.monotonic() - start, caught=traffic)
                    return ready
                if time.monotonic() >= deadline:
                    break
        ready = dict(poller.poll(timeout=self._poll_ms()))
        elapsed = time.monotonic() - start if self._traffic(ready) else math.inf
        self.spin.waited(elapsed, caught=False)
        return ready

    def _poll_ms(self) -> int:
        """How long the loop may wait for input: until the first held Accepted is due."""
        return self.core.wait_ms(time.monotonic())

    def _traffic(self, ready: dict[Any, int]) -> bool:
        """Whether input that ended a wait is traffic, which keeps or earns polling: a
        client's frame, or any while requests are out (an idle router's heartbeats
        gather for 200 ms instead: serve)."""
        return bool(self.core.requests) or self.client_sock.sock in ready

    def turn(self, ready: dict[Any, int] | None = None) -> bool:
        """One bounded slice of work; True when client work was left for the next turn.

        Worker frames are read in full before anything is expired, client work is
        bounded per turn (broker/admission.py), so heartbeats are never starved.
        ``ready``: the sockets a poll found readable; the others are not read this
        turn (an empty read is not free: docs/results/router-overhead.md). None: read
        every one.
        """
        core, now = self.core, time.monotonic()
        if ready is None or self._client_monitor in ready:
            drain(self._client_monitor, "clients", self.peers)
        watch = ready is None or self._monitor in ready
        if watch and drain(self._monitor, "workers", self.peers):
            core.disconnected(now)
        # Workers first: finishing requests frees capacity for new ones.
        skip = ready is not None and self.worker_sock.sock not in ready
        if skip or self.drain_workers():
            core.tick(now)  # liveness: once every worker frame waiting has been read
        # After their frames: a worker that said Goodbye before its connection closed
        # is gone, not probed (its Welcome failing logged a drop on every clean stop).
        if core.liveness.probes:  # an unreachable worker is dropped as its Welcome fails
            core.probe(now)
        self._flush()  # whatever expiring workers failed
        if core.tokenizing and (ready is None or self.tokenizing.fd in ready):
            core.tokenized()
        adm = self.cfg.admission
        more = False
        if ready is None or self.client_sock.sock in ready:
            frames, size = adm.client_frames_per_turn, CLIENT_TURN_BYTES
            more = not self._drain(self.client_sock, core.client, frames, max_bytes=size)
        return self.dispatch_pending(limit=adm.routes_per_turn) or more

    def drain_workers(self) -> bool:
        """Every waiting worker frame (repeated heartbeats noted, not decoded);
        True when the socket was emptied."""
        return self._drain(self.worker_sock, self.core.worker, 100_000, workers=True)

    def drain_clients(self, limit: int = 256, max_bytes: int = 1 << 62) -> bool:
        """Up to ``limit`` waiting client frames, or until ``max_bytes`` are read; True
        when the socket was emptied."""
        return self._drain(self.client_sock, self.core.client, limit, max_bytes=max_bytes)

    def _drain(
        self,
        sock: RouterSocket,
        handler: Any,
        limit: int,
        workers: bool = False,
        max_bytes: int = 1 << 62,
    ) -> bool:
        """Hand up to ``limit`` waiting frames (or until ``max_bytes`` are read) to the
        core; True when the socket was emptied. A worker's frame goes to the core as it
        came (``RouterCore.worker_frame``: a repeated heartbeat is not decoded)."""
        core, emptied, size = self.core, False, 0
        for _ in range(limit):
            parts = sock.recv_frames_nowait()
            if parts is None:
                emptied = True
                break
            now = time.monotonic()
            # Nothing a peer sends may raise out of a turn: parse (which refuses any
            # bad frame as a ProtocolError, common/protocol.decode) and handling both
            # stand inside this one boundary.
            try:
                if workers and len(parts) == 2:
                    core.worker_frame(parts[0], parts[1], now)
                else:
                    handler(*sock.parse(parts), now)
            except Exception:  # a bug must not take the router down with it
                core.refusals.note("router failed handling a frame from %r", parts[0],
                                   exc_info=True)  # fmt: skip
            size += len(parts[-1])
            if size >= max_bytes:
                break
            if not sock.waiting():  # cheaper than the read that would find nothing
                emptied = True
                break
        core.drained()  # token deltas coalesced over this drain
        self._flush()
        return emptied or not sock.waiting()

    def dispatch_pending(self, limit: int | None = None) -> bool:
        """Route waiting requests in order, then flush; True when ``limit`` routes left
        some behind."""
        return self.core.route_and_flush(self, time.monotonic(), limit)

    def _flush(self) -> None:
        """Send what the core owes its peers (``RouterCore.flush``, through this loop's
        ``to_workers`` / ``to_clients``)."""
        self.core.flush(self, time.monotonic())

    # ------------------------------------------------------------ Peers (broker/outgoing.py)
    def to_workers(self, held: Held, now: float) -> Lost:
        return self._send(self.worker_sock, held)

    def to_clients(self, held: Held, now: float) -> Lost:
        return self._send(self.client_sock, held)

    def write_decisions(self, records: Records, now: float) -> None:
        if self.decision_log:
            for _, record in records:
                self.decision_log.write(record)

    @staticmethod
    def _send(sock: RouterSocket, held: Held) -> Lost:
        """Send ``held`` through ``sock``, one frame per peer (common/transport.py); the
        peers it could not reach, with what they did not get."""
        sock.held = held
        return sock.flush()
