"""Small typed wrappers over the ZeroMQ sockets tandem uses.

One ``zmq.Context`` per process (``zmq.Context.instance()``). The router binds
ROUTER sockets; clients and workers connect DEALER sockets. A socket is used by
one thread only (it may be created on another before that thread starts).
"""

from __future__ import annotations

import logging
import uuid
from collections import deque
from collections.abc import Callable

import zmq

from tandem.common import protocol
from tandem.common.protocol import Message, ProtocolError
from tandem.common.refusals import RefusalLog

log = logging.getLogger(__name__)
_DROPS = RefusalLog(log)  # frames a peer could not be sent, logged at a bounded rate

# Send flags as plain ints: combining zmq's flag enums costs more than the send.
_NOW = int(zmq.NOBLOCK)
_MORE_NOW = int(zmq.SNDMORE | zmq.NOBLOCK)
_RCVMORE = int(zmq.RCVMORE)
_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)


CLIENT_FRAME_BYTES = 8 << 20  # the router's limit on client frames (a Submit)
# A batch frame closes when it would pass this size (far below any peer's MAXMSGSIZE)
# or this many messages (the protocol's bound, common/validation.py).
BATCH_BYTES = 1 << 20
BATCH_MESSAGES = 4096
Setup = Callable[[zmq.Socket], None]  # e.g. CURVE options (common/auth.py), before bind/connect


def context() -> zmq.Context:
    return zmq.Context.instance()


def monitor_socket(sock: zmq.Socket, events: int) -> zmq.Socket:
    """``sock.get_monitor_socket(events)`` on an address of its own.

    pyzmq's default address is ``inproc://monitor.s-<fd>``: a new socket that reuses
    a closed one's descriptor collides with that socket's monitor endpoint until the
    closed one is reaped ("Address already in use", seen in CI).
    """
    return sock.get_monitor_socket(events, addr=f"inproc://tandem-monitor-{uuid.uuid4().hex}")


def close_monitor(sock: zmq.Socket, monitor: zmq.Socket) -> None:
    """Stop ``sock``'s monitor, then close ``monitor`` (from ``monitor_socket``): call it
    before closing ``sock``, and never close the monitor alone.

    libzmq sends a monitor event from the context's I/O thread with a blocking send.
    An event for a monitor whose reading end is gone waits for a reader that never
    comes, and that I/O thread carries every socket of the context: every client of
    the process then stalls at once (seen in CI: a test's client closed its monitor
    first, its socket saw the router go, and each later test of the process timed out
    waiting for a router that had answered)."""
    if not sock.closed:
        sock.disable_monitor()
    monitor.close(linger=0)


def _limit(sock: zmq.Socket, max_msg_bytes: int, setup: Setup | None) -> None:
    # A larger frame closes the sender's connection before it is ever buffered whole.
    sock.setsockopt(zmq.MAXMSGSIZE, max_msg_bytes)
    if setup is not None:
        setup(sock)


class RouterSocket:
    """A bound ROUTER socket: every message comes with the sender's identity."""

    def __init__(self, address: str, max_msg_bytes: int = -1, setup: Setup | None = None) -> None:
        self.sock = context().socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        _limit(self.sock, max_msg_bytes, setup)
        # Fail loudly instead of silently dropping frames to a peer that left.
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        # Token streams are many small frames: a deep queue absorbs a slow reader.
        self.sock.setsockopt(zmq.SNDHWM, 100_000)
        self.sock.bind(address)
        self.address = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        # What ``queue`` holds for ``flush``, per peer in order (empty: nothing to send).
        self.held: dict[bytes, list[Message]] = {}

    def queue(self, identity: bytes, msg: Message) -> None:
        """Hold ``msg`` for ``identity`` until ``flush``: what one peer is owed over a
        pass of the router's loop leaves in one frame, not one frame per message."""
        held = self.held.get(identity)
        if held is None:
            self.held[identity] = [msg]
        else:
            held.append(msg)

    def flush(self) -> list[tuple[bytes, list[Message]]]:
        """Send what ``queue`` holds, per peer in order: a lone message in its own
        frame, more as ``batch`` frames. Returns the peers that could not be reached
        with the messages they did not get (the sender decides what that means)."""
        if not self.held:
            return []
        held, self.held = self.held, {}
        lost = []
        for identity, msgs in held.items():
            sent = self._send_held(identity, msgs)
            if sent < len(msgs):
                lost.append((identity, msgs[sent:]))
        return lost

    def _send_held(self, identity: bytes, msgs: list[Message]) -> int:
        """How many of ``msgs`` went out (all, or those before a failed frame)."""
        if len(msgs) == 1:
            return 1 if self.send(identity, msgs[0]) else 0
        sent = start = size = 0
        entries: list[bytes] = []
        for msg in msgs:
            entry = protocol.batch_entry(msg)
            if entries and (size + len(entry) > BATCH_BYTES or len(entries) >= BATCH_MESSAGES):
                if not self._send_frame(identity, protocol.join_batch(entries), msgs[start], True):
                    return sent
                sent, start, size, entries = sent + len(entries), sent + len(entries), 0, []
            entries.append(entry)
            size += len(entry)
        if self._send_frame(identity, protocol.join_batch(entries), msgs[start], True):
            sent += len(entries)
        return sent

    def _send_frame(self, identity: bytes, frame: bytes, first: Message, batch: bool) -> bool:
        try:
            self.sock.send(identity, _MORE_NOW)
            self.sock.send(frame, _NOW)
            return True
        except zmq.ZMQError as exc:  # EHOSTUNREACH (peer left) or EAGAIN (peer stalled)
            what = f"a batch ({first.TYPE}, ...)" if batch else first.TYPE
            _DROPS.note("dropping %s to %r: %s", what, identity, exc)  # a peer that never reads
            return False

    def send(self, identity: bytes, msg: Message) -> bool:
        """Send to one peer; False when the peer is gone (never raises for that)."""
        return self._send_frame(identity, protocol.encode(msg), msg, False)

    def recv(self) -> tuple[bytes, Message | ProtocolError]:
        """One message, or the ProtocolError that describes why it was rejected."""
        return self._parse(self.sock.recv_multipart())

    def recv_frames_nowait(self) -> list[bytes] | None:
        """The next message's raw frames (identity first), or None when none waits."""
        sock = self.sock
        try:
            parts = [sock.recv(_NOW)]
        except zmq.Again:
            return None
        # A peer's message is its identity and one frame: two reads and one RCVMORE
        # test, where recv_multipart tests after each (pyzmq calls cost ~3 us here).
        parts.append(sock.recv(_NOW))
        while sock.get(_RCVMORE):
            parts.append(sock.recv(_NOW))
        return parts

    def waiting(self) -> bool:
        """Whether a message waits to be read (the socket's ZMQ_EVENTS): a read that
        finds nothing raises zmq.Again, which costs several times this
        (docs/results/router-overhead.md)."""
        return bool(self.sock.get(_EVENTS) & _POLLIN)

    def parse(self, parts: list[bytes]) -> tuple[bytes, Message | ProtocolError]:
        """``recv_frames_nowait``'s frames as ``recv`` returns them."""
        return self._parse(parts)

    def recv_nowait(self) -> tuple[bytes, Message | ProtocolError] | None:
        """Like ``recv``, or None at once when nothing is waiting.

        Draining with this instead of ``poll(0)`` + ``recv`` saves building a
        poller per message (``Socket.poll`` makes one each call).
        """
        try:
            parts = self.sock.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return None
        return self._parse(parts)

    def _parse(self, parts: list[bytes]) -> tuple[bytes, Message | ProtocolError]:
        identity = parts[0]
        if len(parts) != 2:
            return identity, ProtocolError(
                protocol.BAD_FRAME, f"expected 1 frame, got {len(parts) - 1}"
            )
        try:
            return identity, protocol.decode(parts[1])
        except ProtocolError as exc:
            return identity, exc

    def close(self) -> None:
        self.sock.close(linger=0)


class DealerSocket:
    """A connected DEALER socket (client or worker side). ``recv`` returns one message
    at a time, a ``batch`` frame's one by one (``poll`` counts those still held)."""

    def __init__(
        self,
        address: str,
        identity: bytes | None = None,
        max_msg_bytes: int = -1,
        setup: Setup | None = None,
    ) -> None:
        self.sock = context().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        _limit(self.sock, max_msg_bytes, setup)
        if identity:
            self.sock.setsockopt(zmq.IDENTITY, identity)
        self.sock.connect(address)
        self.address = address
        self._held: deque[Message | ProtocolError] = deque()  # a batch's rest

    def send(self, msg: Message) -> None:
        self.sock.send(protocol.encode(msg))

    def poll(self, timeout_ms: int) -> bool:
        return bool(self._held) or bool(self.sock.poll(timeout_ms, zmq.POLLIN))

    def recv(self) -> Message | ProtocolError:
        if self._held:
            return self._held.popleft()
        try:
            msgs = protocol.decode_all(self.sock.recv())
        except ProtocolError as exc:
            return exc
        self._held.extend(msgs[1:])
        return msgs[0]

    def close(self) -> None:
        self.sock.close(linger=0)
