"""Watching a client's connection to the router: the events that fail its requests.

A client socket carries one monitor for its whole life, attached before it
connects. Two kinds of event matter:

- a closed connection (``DISCONNECTED``) loses every request in flight on it: the
  router answers on the connection a request came in on;
- a refused handshake (``HANDSHAKE_FAILED_*``: wrong or missing keys) means no
  request will ever get through. libzmq reports it once, as the connection is
  made, and then drops the connection for good (a wrong key) or retries it every
  ~0.1 s (a wrong router key); in the first case the next message still goes
  into the dead connection and the ones after it block the sender forever. So
  the monitor must exist before the connection does, and the refusal is kept:
  the client fails every pending and later call with it.

The monitor's queue has no limit (``RCVHWM`` 0 on the reading end): libzmq sends
each event with a blocking send from the context's I/O thread, so a bounded queue
that nobody reads while a client idles (a wrong router key: two events per retry)
would stall every socket of the process once full (common.transport.close_monitor).
Unbounded, an idle client's events cost memory only, and only while its
connection keeps failing; the refused client disconnects, which stops the retries.
"""

from __future__ import annotations

import contextlib
import uuid

import zmq
from zmq.utils.monitor import parse_monitor_message

from tandem.client.errors import HandshakeRefused

REFUSALS = {
    zmq.EVENT_HANDSHAKE_FAILED_AUTH: "our key is not one it accepts",
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "one side uses keys and the other does not",
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: (
        "our key exchange got no answer (router.key in our keys folder may not be its key)"
    ),
}
EVENTS = zmq.EVENT_DISCONNECTED | sum(REFUSALS)


def attach(sock: zmq.Socket) -> zmq.Socket:
    """A monitor of ``sock`` for EVENTS with an unbounded queue; call before connect.
    For an asyncio socket the monitor is an asyncio socket too."""
    address = f"inproc://tandem-client-monitor-{uuid.uuid4().hex}"
    sock.monitor(address, EVENTS)
    monitor = sock.context.socket(zmq.PAIR)
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
