"""Connections per peer address, capped on both router sockets.

Every idle connection holds a descriptor of the router's; ~4,096 idle DEALERs from
one host once left it none, and every later client was refused without a word in
its log. The router's loop counts the connections each address holds from its
sockets' monitor events (``accepted`` / ``closed``: a connection's descriptor
names its peer), and the ZAP handler (common/auth.py), which sees each new
connection's address before its first frame, refuses one from an address that
already holds ``max_per_address``. Each refusal is counted (``refused``, by
socket, and ``tandem_connections_refused_total``); the first from an address is
logged, once (at most MAX_LOGGED addresses are remembered for that).

The count lags the loop by the events it has not read yet, so a burst may pass
the cap by what arrives within one turn; the next connections are refused.
"""

from __future__ import annotations

import logging
import os
import socket
from collections import Counter
from collections.abc import Callable

import zmq
from zmq.utils.monitor import parse_monitor_message

log = logging.getLogger("tandem.auth")

MAX_PER_ADDRESS = 1024  # default: a host's workers, gateways and CLI runs stay far below
MAX_LOGGED = 4096  # addresses whose first refusal was logged, remembered
TRACKED = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED  # the monitor events ``event`` reads


class PeerLimit:
    """Open connections by peer address (one per router, shared by both sockets'
    domains); read by the ZAP thread, written by the loop (single dict operations)."""

    def __init__(self, max_per_address: int = MAX_PER_ADDRESS) -> None:
        if max_per_address < 1:
            raise ValueError("max_per_address must be >= 1")
        self.max_per_address = max_per_address
        self.open: dict[tuple[str, str], int] = {}  # (domain, address) -> connections
        self._fds: dict[tuple[str, int], str] = {}  # (domain, descriptor) -> address
        self.refused: Counter[str] = Counter()  # by domain
        self._logged: set[str] = set()
        self.on_refused: Callable[[str], None] | None = None  # e.g. a metrics counter

    def admit(self, domain: str, address: str) -> bool:
        """Whether a new connection from ``address`` to ``domain``'s socket may in
        (the ZAP thread asks, before the connection's first frame)."""
        if not address or self.open.get((domain, address), 0) < self.max_per_address:
            return True  # "": not an IP peer (ipc://), nothing to count by
        self.refused[domain] += 1
        if self.on_refused is not None:
            self.on_refused(domain)
        if address not in self._logged and len(self._logged) < MAX_LOGGED:
            self._logged.add(address)
            log.warning("refusing connections from %s on the %s socket: it holds %d already, "
                        "the most one address may (further refusals from it are only counted)",
                        address, domain, self.max_per_address)  # fmt: skip
        return False

    def event(self, domain: str, frames: list[bytes]) -> bool:
        """One monitor event of ``domain``'s socket; True when a connection closed."""
        msg = parse_monitor_message(frames)
        kind, fd = msg["event"], int(msg["value"])
        if kind == zmq.EVENT_ACCEPTED:
            address = _peer_address(fd)
            if address:
                self._fds[(domain, fd)] = address
                key = (domain, address)
                self.open[key] = self.open.get(key, 0) + 1
            return False
        if kind != zmq.EVENT_DISCONNECTED:
            return False
        address = self._fds.pop((domain, fd), "")
        if address:
            left = self.open.get((domain, address), 1) - 1
            if left > 0:
                self.open[(domain, address)] = left
            else:
                self.open.pop((domain, address), None)
        return True


def _peer_address(fd: int) -> str:
    """The IP address of the peer on descriptor ``fd`` ("" when it has none, or is gone)."""
    try:
        # A copy of libzmq's descriptor: the socket object closes its own copy only.
        with socket.socket(fileno=os.dup(fd)) as s:
            if s.family not in (socket.AF_INET, socket.AF_INET6):
                return ""
            return str(s.getpeername()[0])
    except OSError:
        return ""


def drain(monitor: zmq.Socket, domain: str, peers: PeerLimit) -> int:
    """Read every waiting event of ``monitor``; how many connections closed."""
    closed = 0
    while monitor.poll(0):
        closed += peers.event(domain, monitor.recv_multipart())
    return closed
