"""Watching a client's connection to the router: the events that fail its requests.

A client socket carries one monitor for its whole life, attached before it
connects. Two kinds of event matter:

- a closed connection (``DISCONNECTED``) whose handshake had succeeded loses every
  request in flight on it (none reached a router before the handshake): the
  router answers on the connection a request came in on;
- an open connection (``CONNECTED``: the TCP or IPC connect went through, which
  the kernel and libzmq's I/O thread do even while the router's loop is busy);
  a call that sees none for ``no_router_s`` of its own time fails with
  RouterUnavailable: nothing listens at the address. (libzmq's ``CONNECT_RETRIED``
  would say "refused" more precisely, but it comes every ~0.1 s for as long as no
  router runs, and an idle client would queue them without end.)
- a refused handshake (``HANDSHAKE_FAILED_*``: wrong or missing keys) means no
  request will ever get through. libzmq reports it once, as the connection is
  made, and then drops the connection for good (a wrong key) or retries it every
  ~0.1 s (a wrong router key); in the first case the next message still goes
  into the dead connection and the ones after it block the sender forever. So
  the monitor must exist before the connection does, and the refusal is kept:
  the client fails every pending and later call with it.
  A handshake that ends with no answer (``HANDSHAKE_FAILED_NO_DETAIL``) is what a
  wrong router key looks like, but also a router that stopped mid-handshake: it
  is a refusal only once the next connection fails the same way (a router that
  is gone accepts none: the call then fails with RouterUnavailable, not with a
  word about keys), and a handshake that succeeds clears it.

The monitor's queue has no limit (``RCVHWM`` 0 on the reading end): libzmq sends
each event with a blocking send from the context's I/O thread, so a bounded queue
that nobody reads while a client idles (a wrong router key: two events per retry)
would stall every socket of the process once full (common.transport.close_monitor).
Unbounded, an idle client's events cost memory only, and only while its
connection keeps failing; the refused client disconnects, which stops the retries.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from typing import TypeVar

import zmq
from zmq.utils.monitor import parse_monitor_message

from tandem.client.errors import HandshakeRefused, RouterUnavailable

REFUSALS: dict[int, str] = {  # by the monitor's event number
    zmq.EVENT_HANDSHAKE_FAILED_AUTH: "our key is not one it accepts",
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "one side uses keys and the other does not",
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: (
        "our key exchange got no answer (router.key in our keys folder may not be its key)"
    ),
}
UNANSWERED = zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL  # a refusal only when it happens twice
EVENTS = (
    zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED | sum(REFUSALS)
)
NO_ROUTER_S = 1.0  # a call that sees no connection this long: no router at the address
LOST, REFUSED = "lost", "refused"  # what an event did to the connection (``Link.read``)
SocketT = TypeVar("SocketT", bound=zmq.Socket)  # a plain or an asyncio socket


def attach(sock: SocketT) -> SocketT:
    """A monitor of ``sock`` for EVENTS with an unbounded queue; call before connect.
    For an asyncio socket the monitor is an asyncio socket too."""
    address = f"inproc://tandem-client-monitor-{uuid.uuid4().hex}"
    sock.monitor(address, EVENTS)
    monitor: SocketT = sock.context.socket(zmq.PAIR)
    monitor.setsockopt(zmq.RCVHWM, 0)  # before connect: the pipe takes its limit then
    monitor.setsockopt(zmq.LINGER, 0)
    monitor.connect(address)
    return monitor


def refusal(address: str, frames: list[bytes], keyed: bool) -> HandshakeRefused | None:
    """The error for one monitor event (its frames), when it is a refused handshake;
    ``keyed``: whether this client uses keys."""
    why = REFUSALS.get(parse_monitor_message(frames)["event"])
    if why is None:
        return None
    if not keyed:  # whatever libzmq saw, the likely cause is the same
        why = "we use no keys, and it may require them"
    return HandshakeRefused(
        f"the router at {address} refused our handshake: {why}. Check the keys given "
        "with --keys or TANDEM_KEYS (docs/SECURITY.md); every call on this client fails"
    )


def stop_retrying(sock: zmq.Socket, address: str) -> None:
    """Drop the connection of a refused client, so libzmq stops retrying it."""
    with contextlib.suppress(zmq.ZMQError):  # gone already: libzmq drops a refused key
        sock.disconnect(address)


class Link:
    """The connection as its monitor reported it: up or not, and since when.

    A call asks ``absent(since)``: the RouterUnavailable to raise when the
    connection has been down for ``no_router_s`` of the time since ``since`` (the
    call's start). An inproc address reports no events: it is never judged absent.
    """

    def __init__(self, address: str, keyed: bool, no_router_s: float = NO_ROUTER_S) -> None:
        self.address, self.keyed, self.no_router_s = address, keyed, no_router_s
        self.judged = not address.startswith("inproc://")
        self.up = False
        self.down_since = time.monotonic()
        self.refused: HandshakeRefused | None = None  # kept: no later call gets through
        self.shaken = False  # the open connection's handshake succeeded
        self.unanswered = False  # the last handshake ended with no answer (UNANSWERED)

    def read(self, frames: list[bytes]) -> str | None:
        """Apply one monitor event; LOST for a closed connection, REFUSED for a
        refused handshake (``refused`` holds the error), else None."""
        event = parse_monitor_message(frames)["event"]
        if event == zmq.EVENT_CONNECTED:
            self.up, self.shaken = True, False
            return None
        if event == zmq.EVENT_DISCONNECTED:
            # Before its handshake a connection carried no request: nothing is lost
            # (what was sent waits in the socket for the next one).
            lost = self.shaken
            self.went_down()
            return LOST if lost else None
        if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self.shaken, self.unanswered = True, False
            return None
        if event == UNANSWERED and not self.unanswered:  # the router may have stopped
            self.unanswered = True
            return None
        refused = refusal(self.address, frames, self.keyed)
        if refused is None:
            return None
        self.refused = self.refused or refused
        return REFUSED

    def went_down(self) -> None:
        self.up, self.shaken, self.down_since = False, False, time.monotonic()

    def wait_left(self, since: float) -> float | None:
        """Seconds until ``absent(since)`` would fire; None while it cannot."""
        if self.up or not self.judged or self.refused is not None:
            return None
        return max(0.0, max(self.down_since, since) + self.no_router_s - time.monotonic())

    def bounded(self, since: float, wait_s: float) -> float:
        """``wait_s``, or less: a waiting call wakes when ``absent(since)`` may fire."""
        left = self.wait_left(since)
        return wait_s if left is None else min(wait_s, left)

    def absent(self, since: float) -> RouterUnavailable | None:
        left = self.wait_left(since)
        if left is None or left > 0:
            return None
        # Gone mid-handshake: what the user must not take for a word about keys.
        words = no_router_message(self.address, self.no_router_s, self.unanswered)
        return RouterUnavailable(words)

    def restart(self, sock: zmq.Socket) -> None:
        """Reconnect ``sock``: what it queued for a router that never came is dropped
        (a router started later must not run a request nobody waits for)."""
        stop_retrying(sock, self.address)
        sock.connect(self.address)
        self.went_down()


def no_router_message(address: str, waited_s: float, mid_handshake: bool = False) -> str:
    what = "it closed our connection during the handshake, and " if mid_handshake else ""
    return (
        f"no router at {address}: {what}nothing accepted a connection there in "
        f"{waited_s:g} s. "
        "Start one with `tandem serve` (or `tandem router`), or give the router's "
        "address with --router or TANDEM_CLIENT_ADDR"
    )
