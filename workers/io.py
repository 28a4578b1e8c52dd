"""The worker's I/O thread: the only owner of the DEALER socket to the router.

The compute thread never touches the network. It hands outgoing messages to this
thread through an inproc PUSH/PULL pipe (so a send wakes the poller at once) and
receives assignments through ``Engine.inbox``. This thread also registers with
the router (Ready, retried with backoff until Welcome), re-registers when the
router has forgotten the worker (router restart), and re-sends the latest
heartbeat whenever the compute thread is busy inside a long model step, so a
worker in the middle of a big prefill is never mistaken for a dead one — but only
for ``stall_s``: a compute thread silent that long is stuck (no step lasts a
minute), and the router must be let to expire the worker and route its requests
elsewhere rather than wait on it forever. When the compute thread speaks again,
the worker simply re-registers.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from typing import TYPE_CHECKING

import msgpack
import zmq

from tandem.common import protocol as p
from tandem.common.refusals import RefusalLog
from tandem.common.transport import DealerSocket, Setup, close_monitor, context, monitor_socket
from tandem.workers.follow import RouterFile
from tandem.workers.frames import HEARTBEAT, TOKENS, Frames, entry

if TYPE_CHECKING:
    from tandem.workers.engine import Inbox

log = logging.getLogger(__name__)

READY_BACKOFF_MAX_S = 5.0
WORKER_FRAME_BYTES = 64 << 20  # an Assign of the largest prompt fits with room
# A wrong router key shows as NO_DETAIL (its hello cannot be decrypted), a key
# the router does not accept as AUTH.
_REFUSED = (
    zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)
FOLLOW_S = 0.25  # how often --router-file is looked at (one stat)
STALL_S = 60.0  # compute-thread silence after which heartbeats are no longer repeated


class WorkerLink:
    def __init__(
        self,
        router_addr: str,
        ready: p.Ready,
        inbox: Inbox,
        stall_s: float = STALL_S,
        setup: Setup | None = None,
        router_file: RouterFile | None = None,
    ) -> None:
        self.router_addr = router_addr
        self.router_file = router_file  # where a moved router's address appears
        self.setup = setup  # CURVE options when the router uses keys
        self._registrations = 0
        self.stall_s = stall_s
        self.ready = ready
        # With a hash, the first Ready leaves the 1.5 MB spec out; a router that
        # lacks it asks (Reregister(tokenizer=True)) and gets it with the next one.
        self._hash_only = p.replace(ready, tokenizer={}) if ready.tokenizer_hash else ready
        self._send_spec = False
        self.inbox = inbox
        self.registered = threading.Event()
        self.fatal: str | None = None  # set when the router refuses us for good
        # Unique per link: an id() can be reused while an earlier link's pipe is still bound.
        self._pipe_addr = f"inproc://tandem-worker-{uuid.uuid4().hex}"
        self._pull = context().socket(zmq.PULL)
        self._pull.setsockopt(zmq.RCVHWM, 0)  # never make the compute thread wait
        self._pull.bind(self._pipe_addr)
        self._local = threading.local()
        self.refusals = RefusalLog(log)  # refused frames by reason, logged at a bounded rate

    def emit(self, msg: p.Message) -> None:
        """Send ``msg`` to the router; callable from any thread but this one."""
        push = getattr(self._local, "push", None)
        if push is None:
            push = self._local.push = context().socket(zmq.PUSH)
            push.setsockopt(zmq.LINGER, 0)
            push.setsockopt(zmq.SNDHWM, 0)  # unbounded: tokens are never dropped here
            push.connect(self._pipe_addr)
        # Sorted as the encoder takes it (workers/frames.py); the I/O thread frames it.
        kind, body = entry(msg)
        if kind == TOKENS:  # fields only, packed to cross the pipe
            body = msgpack.packb(body)
        try:
            push.send_multipart([kind, body], flags=zmq.NOBLOCK)
        except zmq.Again:  # the I/O thread is gone (shutting down): nobody to tell
            log.debug("dropped %s after the I/O thread stopped", msg.TYPE)

    def run(self, stop: threading.Event) -> None:
        # The identity names this process, not only the worker id: a ROUTER drops a
        # second connection under an identity in use without a word, so a duplicate id
        # could never be told it is one (the router refuses it by id, broker/registry.py).
        identity = self.ready.worker_id.encode()[:200] + b"/" + self.ready.instance.encode()[:16]
        dealer = DealerSocket(self.router_addr, identity, WORKER_FRAME_BYTES, self.setup)
        poller = zmq.Poller()
        poller.register(dealer.sock, zmq.POLLIN)
        poller.register(self._pull, zmq.POLLIN)
        # A refused CURVE handshake is otherwise silent: the Ready just never lands.
        refused = monitor_socket(dealer.sock, _REFUSED)
        poller.register(refused, zmq.POLLIN)
        backoff_s, next_ready, next_follow = 0.25, 0.0, 0.0
        vouch = Vouching(self.ready.heartbeat_s, self.stall_s, time.monotonic())
        try:
            while not stop.is_set():
                now = time.monotonic()
                if not self.registered.is_set() and now >= next_ready:
                    dealer.send(self.ready if self._send_spec else self._hash_only)
                    next_ready, backoff_s = now + backoff_s, min(backoff_s * 2, READY_BACKOFF_MAX_S)
                events = dict(poller.poll(timeout=int(vouch.hb_s * 250)))
                if self._pull in events:
                    self._relay(dealer, vouch)
                if dealer.sock in events:
                    while dealer.poll(0):
                        if self._receive(dealer):
                            backoff_s, next_ready = 0.25, 0.0
                if self.router_file is not None and now >= next_follow:
                    next_follow = now + FOLLOW_S
                    if self._follow(dealer):
                        backoff_s, next_ready = 0.25, 0.0
                if refused in events:
                    refused.recv_multipart()
                    log.error("router %s refused our handshake: wrong or missing keys "
                              "(--keys, docs/SECURITY.md)", self.router_addr)  # fmt: skip
                beat = vouch.due(time.monotonic(), self.registered.is_set())
                if beat is not None:  # the compute thread is busy: repeat the latest state
                    dealer.sock.send(beat)
        finally:
            if self.registered.is_set():
                dealer.send(p.Goodbye(self.ready.worker_id))
                time.sleep(0.05)  # let the goodbye leave before the socket closes
            close_monitor(dealer.sock, refused)
            dealer.close()
            self._pull.close(linger=0)

    def _relay(self, dealer: DealerSocket, vouch: Vouching) -> None:
        """What the compute thread left in the pipe, sent as few frames (workers/frames.py:
        the one encoder, which the twin's workers send through too)."""
        out = Frames(dealer.sock.send)
        while True:
            try:
                kind, frame = self._pull.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            now = time.monotonic()
            vouch.heard(now)
            if kind == HEARTBEAT:  # kept to repeat; sent once registered
                vouch.last_hb = frame
                if not self.registered.is_set():
                    continue
                vouch.sent_at = now
            out.put(kind, msgpack.unpackb(frame) if kind == TOKENS else frame)
        out.flush()

    def _follow(self, dealer: DealerSocket) -> bool:
        """The router moved (--router-file): connect there and register again at once.
        The new router's Welcome makes us drop what the old one gave us (_dispatch)."""
        assert self.router_file is not None
        addr = self.router_file.moved()
        if addr is None:
            return False
        log.warning("the router moved: %s -> %s; registering there", self.router_addr, addr)
        with contextlib.suppress(zmq.ZMQError):  # already gone: nothing to undo
            dealer.sock.disconnect(self.router_addr)
        dealer.sock.connect(addr)
        self.router_addr = dealer.address = addr
        self.registered.clear()
        return True

    def _receive(self, dealer: DealerSocket) -> bool:
        """Read and handle one message; True when we must re-register now. Nothing the
        router's socket carries may raise out of here: this thread is the worker's
        only ear (a bad frame is refused by ``protocol.decode``, a bug it trips is
        logged, both at a bounded rate)."""
        try:
            return self._dispatch(dealer.recv())
        except Exception:
            self.refusals.note("worker failed handling a frame from the router", exc_info=True)
            return False

    def _dispatch(self, msg: p.Message | p.ProtocolError) -> bool:
        """Handle one message from the router; True when we must re-register now."""
        if isinstance(msg, p.ProtocolError):
            self.refusals.refused(msg.reason, "bad frame from router (%s): %s", msg.reason, msg)
            if msg.code == p.VERSION_MISMATCH:  # the router speaks another version
                self.fatal = msg.message
        elif isinstance(msg, p.Welcome):
            if not self.registered.is_set():
                log.info("registered with router %s (epoch %s)", self.router_addr, msg.epoch)
                self.registered.set()
                if self._registrations:
                    # What an earlier registration assigned was failed or re-routed by
                    # the router already (broker/identity.py): drop it, do not finish it.
                    self.inbox.put(p.Reregister())
                self._registrations += 1
                self.inbox.put(p.ResyncCache())  # the router starts from an empty view
        elif isinstance(msg, p.Reregister):
            if msg.tokenizer and not self._send_spec:
                log.info("router asked for our tokenizer spec")
                self._send_spec = True
                self.registered.clear()
                return True
            if not self.registered.is_set():
                return False  # a Ready is already on its way (with backoff)
            log.info("router asked us to register again")
            self.registered.clear()
            return True
        elif isinstance(msg, p.Error):
            log.error("router error %s: %s", msg.code, msg.message)
            if msg.request_id is None and not self.registered.is_set():
                self.fatal = msg.message  # our Ready was refused: retrying cannot help
        elif isinstance(msg, p.Assign | p.Cancel | p.ResyncCache):
            self.inbox.put(msg)
        else:
            log.warning("worker ignores %s from router", msg.TYPE)
        return False


class Vouching:
    """The latest heartbeat, repeated every ``hb_s`` while the compute thread is busy
    in a long step, but only for ``stall_s`` of its silence: a compute thread silent
    that long is stuck, and the router must be let to expire the worker."""

    def __init__(self, hb_s: float, stall_s: float, now: float) -> None:
        self.hb_s, self.stall_s = hb_s, stall_s
        self.last_hb: bytes | None = None
        self.sent_at = self.heard_at = now  # heard: from the compute thread
        self.stalled = False

    def heard(self, now: float) -> None:
        self.heard_at = now
        if self.stalled:
            log.warning("the compute thread is back")
            self.stalled = False

    def due(self, now: float, registered: bool) -> bytes | None:
        """The heartbeat to repeat now, if one is due."""
        if not self.stalled and now - self.heard_at > self.stall_s:
            log.error("the compute thread has been silent for %.0f s: stuck; no longer "
                      "vouching for it", now - self.heard_at)  # fmt: skip
            self.stalled = True
        if self.last_hb is None or not registered or self.stalled or now - self.sent_at < self.hb_s:
            return None
        self.sent_at = now
        return self.last_hb


def start_link(link: WorkerLink, stop: threading.Event) -> threading.Thread:
    thread = threading.Thread(target=link.run, args=(stop,), name="tandem-io", daemon=True)
    thread.start()
    return thread
