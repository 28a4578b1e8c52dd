"""The join service ``tandem serve`` runs beside the router: it turns a one-time token
into an authorized worker key (common/join.py says the exchange; docs/SECURITY.md).

It listens on its own address with the router's CURVE key pair, and lets any client
key through the handshake (the token's secret, sent encrypted, is what admits); its
ZAP handler names each connection's public key, so the key authorized is the one
that made the handshake, never one a request names. A thread of the serve process,
with a zmq.Context of its own: a ZAP handler is per context, and the router's keys
must not admit anyone to this socket nor this one's to any other.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from tandem.common.auth import authorize
from tandem.common.join import (
    JOIN_VERSION,
    MAX_JOIN_FRAME_BYTES,
    JoinAccepted,
    JoinRefused,
    JoinToken,
    decode_request,
    encode,
    key_fingerprint,
)
from tandem.common.refusals import RefusalLog
from tandem.launcher.config import ServeConfig
from tandem.launcher.tokens import JoinTokens

log = logging.getLogger(__name__)
MAX_DEVICES_SHOWN = 8  # of a joiner's device labels, on the serve screen
DOMAIN = "join"
WORDS = {
    "unknown": "this join token is not one this router issued (or it was issued by an "
    "earlier run of tandem serve)",
    "used": "this join token was already used by another host; ask for a new one (each "
    "token admits one host)",
    "expired": "this join token expired; ask for a new one",
    "node_taken": "another host joined under this node name: pass --node NAME (or "
    "TANDEM_NODE) with a name of its own; the token stays unused",
}


@dataclass(frozen=True)
class Offer:
    """What an admitted joiner is told (common.join.JoinAccepted's fields)."""

    worker_addr: str
    model: str = ""
    model_name: str = ""
    weights: str = ""
    portable: bool = True


class JoinService:
    def __init__(self, address: str, keys: Path, offer: Offer, tokens: JoinTokens) -> None:
        self.keys, self.offer, self.tokens = keys, offer, tokens
        self.lock = threading.Lock()  # tokens: issued by the supervisor, redeemed here
        self.events: queue.Queue[tuple[str, str]] = queue.Queue()  # (node, words) joined
        self.refusals = RefusalLog(log)  # a flood of bad tokens logs a bounded few lines
        self.ctx = zmq.Context()
        self.auth = ThreadAuthenticator(self.ctx, log=logging.getLogger("tandem.join.auth"))
        self.auth.start()
        self.auth.configure_curve(domain=DOMAIN, location=zmq.auth.CURVE_ALLOW_ANY)
        public, secret = zmq.auth.load_certificate(keys / "router.key_secret")
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.MAXMSGSIZE, MAX_JOIN_FRAME_BYTES)
        self.sock.curve_server = True
        self.sock.curve_publickey, self.sock.curve_secretkey = public, secret
        self.sock.zap_domain = DOMAIN.encode()
        try:
            self.sock.bind(address)
        except zmq.ZMQError as exc:
            self.close()
            raise ValueError(
                f"the join service cannot listen on {address} ({exc.strerror}): move it "
                "with --join-addr tcp://HOST:PORT"
            ) from None
        self.address = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="tandem-join", daemon=True)

    def start(self) -> JoinService:
        self.thread.start()
        return self

    def issue(self) -> JoinToken:
        with self.lock:
            return self.tokens.issue(time.monotonic())

    def _run(self) -> None:
        while not self.stop.is_set():
            if not self.sock.poll(100):
                continue
            try:
                parts = self.sock.recv_multipart(copy=False)
                if len(parts) != 2:
                    continue  # not a DEALER's one frame: nobody to answer sensibly
                reply = self._answer(parts[1])
                # A peer that never reads loses its answer, never stalls the service.
                self.sock.send_multipart([parts[0].bytes, encode(reply)], zmq.NOBLOCK)
            except zmq.ZMQError as exc:
                log.debug("join service: %s", exc)
            except Exception:  # a bug here must not end the service; the joiner times out
                log.exception("join request failed")

    def _answer(self, frame: zmq.Frame) -> JoinAccepted | JoinRefused:
        try:
            req = decode_request(frame.bytes)
        except ValueError as exc:
            self.refusals.refused("bad_request", "join request refused: %s", exc)
            return JoinRefused(v=JOIN_VERSION, reason="bad_request", message=str(exc))
        key = str(frame.get("User-Id")).encode()  # the handshake's key (ZAP, Z85)
        with self.lock:
            verdict = self.tokens.redeem(req.secret, key, req.node, time.monotonic())
        if verdict.issued is None:
            reason = verdict.reason
            self.refusals.refused(reason, "join refused (%s) for node %s", reason, req.node)
            return JoinRefused(v=JOIN_VERSION, reason=reason, message=WORDS[reason])  # type: ignore[arg-type]
        if not verdict.repeat:
            name = "join_" + re.sub(r"\W", "_", req.node) + "_" + key_fingerprint(key)[:8]
            path = authorize(self.keys, "worker", name, key, f"node {req.node}")
            log.debug("node %s joined: its key is %s", req.node, path)
            self.events.put((req.node, f"joined ({_devices(req.devices)})"))
        return JoinAccepted(v=JOIN_VERSION, **dataclasses.asdict(self.offer))

    def close(self) -> None:
        if hasattr(self, "thread") and self.thread.is_alive():
            self.stop.set()
            self.thread.join(timeout=2.0)
        self.sock.close(linger=0)
        self.auth.stop()
        self.ctx.term()


def _devices(labels: list[str]) -> str:
    """A joiner's device labels for the screen, bounded (a peer chose them)."""
    shown = [d[:32] for d in labels[:MAX_DEVICES_SHOWN]]
    return ", ".join(shown + ["..."] * (len(labels) > MAX_DEVICES_SHOWN)) or "its devices"


def private_keys(folder: Path) -> Path:
    """A keys folder of serve's own (``tandem keys``' layout) that only this user can
    read: made when serve lets other hosts in and was given no keys."""
    from tandem.common.auth import make_keys

    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    folder.chmod(0o700)
    if not (folder / "router.key").exists():
        make_keys(folder)
    return folder


def offer_for(model: str | None, path: Path | None, worker_addr: str) -> Offer:
    """What a joiner is told about the model: a hub name or the embedded default it
    resolves itself; a file of this host it must be given (its digest to check)."""
    from tandem.common.gguf_file import weights_digest
    from tandem.common.model_files import HubName

    if not model or HubName.parse(model) and not Path(model).expanduser().exists():
        name = path.name if path else ""
        return Offer(worker_addr, model or "", name)
    digest = weights_digest(path) if path is not None and path.is_file() else ""
    return Offer(worker_addr, "", path.name if path else model, digest, portable=False)


def start_service(
    address: str, cfg: ServeConfig, worker_addr: str, path: Path | None
) -> JoinService:
    """The join service for ``cfg`` (keys set), listening on ``address``."""
    assert cfg.keys is not None
    keys = Path(cfg.keys).expanduser()
    router_key = zmq.auth.load_certificate(keys / "router.key")[0]
    offer = offer_for(cfg.model, path, worker_addr)
    return JoinService(address, keys, offer, JoinTokens(router_key)).start()
