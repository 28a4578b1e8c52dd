"""The process's one ZAP handler, shared by every router it runs.

libzmq asks a context's ZAP handler (at ``inproc://zeromq.zap.01``: one per
context) about each new connection to a socket with a ZAP domain, before its
first frame. The router's two sockets always have one, keys or not: the gate
first applies their router's cap on connections per address
(common/peerlimit.py), then pyzmq's authenticator checks the CURVE key where the
router has keys (``KeyFolder``: the folder's keys, re-read when it changes) and
lets a NULL connection in where it has none.
Each router's sockets get domains of their own (``workers.3``), so several
routers in one process (tests, the twin) keep their own counts and keys. The
gate, once started, runs until the process ends (a daemon thread): a new one
could not bind its endpoint while the last one's is being released.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from pathlib import Path

import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from tandem.common.peerlimit import PeerLimit
from tandem.common.transport import context

log = logging.getLogger(__name__)


class _Gate(ThreadAuthenticator):
    def __init__(self) -> None:
        super().__init__(context(), log=logging.getLogger("tandem.auth"))
        self.routes: dict[str, tuple[str, PeerLimit]] = {}  # ZAP domain -> (socket, limit)

    async def handle_zap_message(self, msg: list[bytes]) -> None:
        if len(msg) >= 6:
            domain, address = (x.decode("utf-8", "replace") for x in msg[2:4])
            route = self.routes.get(domain)
            if route is not None and not route[1].admit(route[0], address):
                self._send_zap_reply(msg[1], b"400", b"too many connections from this address")
                return
        await super().handle_zap_message(msg)


class KeyFolder:
    """The public keys a ZAP domain accepts: the ``*.key`` files of one folder, read
    again whenever the folder changes, so a key added (``tandem join``, ``tandem keys
    --add``) is accepted and a key deleted refused from the next handshake on, with no
    restart. A handshake only stats the folder; it is re-read when its mtime moved."""

    FRESH_NS = 2_000_000_000  # a folder changed this recently may change again unseen

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.stamp: int | None = None
        self.read_ns = 0
        self.keys: frozenset[bytes] = frozenset()

    def callback(self, domain: str, key: bytes) -> bool:
        """pyzmq's credentials-provider hook: is ``key`` (Z85) accepted?"""
        try:
            stamp = self.folder.stat().st_mtime_ns
        except OSError:
            return False
        # A second change within the clock tick of the first leaves the mtime as it
        # was: a folder changed just before it was read is read again while fresh.
        if stamp != self.stamp or self.read_ns - stamp < self.FRESH_NS:
            self.read_ns = time.time_ns()
            self.keys = frozenset(_public_keys(self.folder))
            self.stamp = stamp
        return key in self.keys


def _public_keys(folder: Path) -> list[bytes]:
    out = []
    for path in folder.glob("*.key"):
        try:
            out.append(zmq.auth.load_certificate(path)[0])
        except (OSError, ValueError) as exc:  # one bad file must not lock every key out
            log.warning("ignoring key file %s: %s", path, exc)
    return out


_lock = threading.Lock()
_gate: _Gate | None = None
_serial = itertools.count(1)


def open_domains(sockets: tuple[str, ...], peers: PeerLimit, keys: Path | None) -> dict[str, str]:
    """ZAP domains for one router's ``sockets`` (workers, clients), by socket name;
    with ``keys``, a connection must also hold a public key in ``keys/<socket>/``."""
    global _gate
    with _lock:
        if _gate is None:
            _gate = _Gate()
            _gate.start()
        n = next(_serial)
        names = {}
        for sock in sockets:
            names[sock] = name = f"{sock}.{n}"
            if keys is not None:
                _gate.configure_curve_callback(name, KeyFolder(keys / sock))
            _gate.routes[name] = (sock, peers)
        return names


def close_domains(names: dict[str, str]) -> None:
    """Forget a router's domains."""
    with _lock:
        if _gate is None:
            return
        for name in names.values():
            _gate.routes.pop(name, None)
            _gate.credentials_providers.pop(name, None)
