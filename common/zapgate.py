"""The process's one ZAP handler, shared by every router it runs.

libzmq asks a context's ZAP handler (at ``inproc://zeromq.zap.01``: one per
context) about each new connection to a socket with a ZAP domain, before its
first frame. The router's two sockets always have one, keys or not: the gate
first applies their router's cap on connections per address
(common/peerlimit.py), then pyzmq's authenticator checks the CURVE key where the
router has keys (common/auth.py) and lets a NULL connection in where it has none.
Each router's sockets get domains of their own (``workers.3``), so several
routers in one process (tests, the twin) keep their own counts and keys. The
gate, once started, runs until the process ends (a daemon thread): a new one
could not bind its endpoint while the last one's is being released.
"""

from __future__ import annotations

import itertools
import logging
import threading
from pathlib import Path

from zmq.auth.thread import ThreadAuthenticator

from tandem.common.peerlimit import PeerLimit
from tandem.common.transport import context


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
                _gate.configure_curve(domain=name, location=str(keys / sock))
            _gate.routes[name] = (sock, peers)
        return names


def close_domains(names: dict[str, str]) -> None:
    """Forget a router's domains."""
    with _lock:
        if _gate is None:
            return
        for name in names.values():
            _gate.routes.pop(name, None)
            _gate.certs.pop(name, None)
