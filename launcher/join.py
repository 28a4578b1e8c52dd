"""``tandem join``'s side of the join exchange (common/join.py): a key pair of this
host's own, the token's secret presented over CURVE, and the answer.

What can go wrong is told apart, since each needs another fix: nothing answers at
the address (the network, or serve not listening beyond its host: ``Unreachable``);
something answers but cannot complete the handshake with the token's router key (a
wrong address or token: ``NotTheRouter``); the router refuses the token (used,
expired, unknown: ``Refused``).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import zmq
import zmq.auth
from zmq.utils.monitor import parse_monitor_message

from tandem.common.auth import write_public_key
from tandem.common.join import (
    JOIN_VERSION,
    JoinAccepted,
    JoinRefused,
    JoinRequest,
    JoinToken,
    decode_reply,
    encode,
)
from tandem.common.model_files import cache_root

WILDCARD_HOSTS = ("0.0.0.0", "*", "::", "[::]", "")
_HANDSHAKE_FAILED = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                     | zmq.EVENT_HANDSHAKE_FAILED_AUTH)  # fmt: skip
_EVENTS = zmq.EVENT_CONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED | _HANDSHAKE_FAILED


class JoinFailed(Exception):
    """Why this host did not join; ``kind`` says whose problem it is."""

    kind = "failed"


class Unreachable(JoinFailed):
    kind = "network"


class NotTheRouter(JoinFailed):
    kind = "not_the_router"


class Refused(JoinFailed):
    kind = "refused"

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Joined:
    keys: Path  # this host's keys folder for the router: router.key + worker.key_secret
    worker_addr: str  # the router's worker address, as this host reaches it
    answer: JoinAccepted


def keys_folder(token: JoinToken, root: Path | None = None) -> Path:
    """This host's keys for the token's router: made once, kept (mode 0700 folder,
    0600 secret), so a restarted ``tandem join`` presents the same key."""
    folder = (root or cache_root() / "join") / token.fingerprint()
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    if not (folder / "worker.key_secret").is_file():
        old = os.umask(0o077)  # the secret is never readable by others, even for a moment
        try:
            zmq.auth.create_certificates(folder, "worker")
        finally:
            os.umask(old)
    (folder / "worker.key_secret").chmod(0o600)
    write_public_key(folder / "router.key", token.router_key, "the router (from the join token)")
    return folder


def join(address: str, token: JoinToken, node: str, devices: list[str],
         timeout_s: float = 15.0, root: Path | None = None) -> Joined:  # fmt: skip
    """Present ``token`` at the join service ``address``; raises a JoinFailed."""
    if "://" not in address:
        address = f"tcp://{address}"
    keys = keys_folder(token, root)
    public, secret = zmq.auth.load_certificate(keys / "worker.key_secret")
    assert secret is not None
    request = JoinRequest(v=JOIN_VERSION, secret=token.secret, node=node, devices=devices)
    reply = _exchange(address, token.router_key, (public, secret), encode(request), timeout_s)
    if isinstance(reply, JoinRefused):
        what = "the join token" if reply.reason in ("unknown", "used", "expired") else "the join"
        raise Refused(reply.reason, f"the router refused {what}: {reply.message}")
    return Joined(keys, reachable(reply.worker_addr, address), reply)


def reachable(worker_addr: str, via: str) -> str:
    """The router's worker address as this host reaches it: a wildcard bind's host
    replaced by the host the join service was reached at."""
    parts = urlsplit(worker_addr)
    if parts.scheme != "tcp" or parts.netloc.rsplit(":", 1)[0] not in WILDCARD_HOSTS:
        return worker_addr
    host = urlsplit(via).netloc.rsplit(":", 1)[0]
    return f"tcp://{host}:{parts.port}"


def _exchange(address: str, server_key: bytes, pair: tuple[bytes, bytes], body: bytes,
              timeout_s: float) -> JoinAccepted | JoinRefused:  # fmt: skip
    ctx: zmq.Context = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.curve_serverkey, (sock.curve_publickey, sock.curve_secretkey) = server_key, pair
    monitor = sock.get_monitor_socket(_EVENTS)
    try:
        sock.connect(address)
        sock.send(body)  # queued until the handshake completes
        return _await(sock, monitor, address, timeout_s)
    finally:
        sock.disable_monitor()
        monitor.close(linger=0)
        sock.close(linger=0)


def _await(sock: zmq.Socket, monitor: zmq.Socket, address: str,
           timeout_s: float) -> JoinAccepted | JoinRefused:  # fmt: skip
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    poller.register(monitor, zmq.POLLIN)
    connected = shook = False
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        ready = dict(poller.poll(int(min(left, 0.5) * 1000)))
        if monitor in ready:
            event = parse_monitor_message(monitor.recv_multipart())["event"]
            connected = connected or event == zmq.EVENT_CONNECTED
            shook = shook or event == zmq.EVENT_HANDSHAKE_SUCCEEDED
            if event & _HANDSHAKE_FAILED and not shook:
                raise NotTheRouter(
                    f"{address} answered, but not as the router this token is for (the "
                    "key exchange with the token's router key failed): check the address "
                    "and that the token is this router's"
                )
        if sock in ready:
            try:
                return decode_reply(sock.recv())
            except ValueError as exc:
                raise NotTheRouter(f"{address}: {exc}") from None
    if not connected:
        raise Unreachable(
            f"nothing answered at {address} within {timeout_s:.0f} s: is tandem serve "
            "running there, listening beyond its own host (serve --listen HOST), and is "
            "the port open between the two machines?"
        )
    raise NotTheRouter(
        f"{address} accepted the connection but did not answer the join within "
        f"{timeout_s:.0f} s (is it tandem serve's join address?)"
    )
