"""The blocking client. One socket per Client; not thread-safe (use one per thread)."""

from __future__ import annotations

import time
from collections import defaultdict, deque
from collections.abc import Iterator
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from tandem.client.errors import BadRequest, RequestTimeout, TandemError, from_error
from tandem.client.session import Assembly, Delta, Result, make_submit, request_id_of
from tandem.common import protocol as p
from tandem.common.auth import peer_setup
from tandem.common.settings import addresses
from tandem.common.transport import (
    CLIENT_FRAME_BYTES,
    DealerSocket,
    close_monitor,
    monitor_socket,
)

# A closed connection loses every request in flight on it: the router answers on
# the connection a request came in on, and a reconnected socket is a new peer.
_REFUSED = (
    zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)
_LOST_EVENTS = zmq.EVENT_DISCONNECTED | _REFUSED


class Client:
    """Talks to a tandem router.

    ``timeout_s``: the longest silence tolerated while a request runs (no token,
    no reply); then the request is cancelled and RequestTimeout raised.
    ``connect_timeout_s`` / ``retries``: a request not accepted in time is sent
    again on a fresh socket (the router may have restarted), up to ``retries`` times.
    ``keys``: the CURVE keys folder when the router uses keys (default TANDEM_KEYS).
    When the connection drops mid-request the request fails at once with
    RouterLost instead of waiting out ``timeout_s``.
    """

    def __init__(
        self,
        address: str | None = None,
        timeout_s: float = 300.0,
        connect_timeout_s: float = 10.0,
        retries: int = 2,
        keys: str | None = None,
    ) -> None:
        self.address = address or addresses().client
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.retries = retries
        self._setup = peer_setup(keys, "client")
        self._mail: dict[str | None, deque[p.Message]] = defaultdict(deque)
        self._open: set[str] = set()  # request ids in flight: mail for others is dropped
        self._connect()

    def _connect(self) -> None:
        self._sock = DealerSocket(self.address, None, CLIENT_FRAME_BYTES, self._setup)
        self._monitor: zmq.Socket | None = None  # watching only while a reply is awaited

    def close(self) -> None:
        self._unwatch(force=True)
        self._sock.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ public API
    def generate(self, prompt: str | None = None, **kwargs: Any) -> Result:
        """Run one request to completion (see ``stream`` for the arguments)."""
        stream = self.stream(prompt, **kwargs)
        for _ in stream:
            pass
        return stream.result

    def stream(self, prompt: str | None = None, **kwargs: Any) -> Stream:
        """Start a request; iterate the returned Stream for Deltas, then read ``.result``.

        Keyword arguments: tokens, messages, max_tokens, temperature, top_p, top_k,
        seed, stop, ignore_eos, worker, prefill_only, request_id.
        """
        kwargs.setdefault("stream", True)
        submit = make_submit(prompt, **kwargs)
        return Stream(self, submit)

    def status(self) -> p.StatusReply:
        reply = self._call(p.StatusQuery(), (p.StatusReply,))
        assert isinstance(reply, p.StatusReply)
        return reply

    def ping(self) -> p.Welcome:
        reply = self._call(p.Hello(name="tandem-client"), (p.Welcome,))
        assert isinstance(reply, p.Welcome)
        return reply

    def cancel(self, request_id: str) -> None:
        self._sock.send(p.Cancel(request_id))

    # ------------------------------------------------------------ plumbing
    def _call(self, msg: p.Message, expect: tuple[type, ...]) -> p.Message:
        """Request/reply without a request id, retried on a fresh socket (Lazy Pirate)."""
        try:
            for _attempt in range(self.retries + 1):
                self._watch()
                self._sock.send(msg)
                reply = self._next(None, self.connect_timeout_s)
                if reply is None:
                    self._reconnect()
                    continue
                if isinstance(reply, p.Error):
                    raise from_error(reply)
                if isinstance(reply, expect):
                    return reply
                raise TandemError(f"unexpected reply {reply.TYPE}")
            raise RequestTimeout(f"no reply from the router at {self.address}")
        finally:
            self._unwatch()

    def _reconnect(self) -> None:
        self.close()
        self._connect()

    def _send(self, msg: p.Message) -> None:
        frame = p.encode(msg)
        if len(frame) > CLIENT_FRAME_BYTES:
            raise BadRequest(
                f"the request is {len(frame)} bytes; the router accepts at most "
                f"{CLIENT_FRAME_BYTES}",
                getattr(msg, "request_id", None),
            )
        self._sock.sock.send(frame)

    def _next(self, request_id: str | None, timeout_s: float) -> p.Message | None:
        """The next message for ``request_id`` (None: replies without an id)."""
        box = self._mail[request_id]
        if box:
            return box.popleft()
        deadline = time.monotonic() + timeout_s
        poller = zmq.Poller()
        poller.register(self._sock.sock, zmq.POLLIN)
        monitor = self._monitor
        assert monitor is not None, "_watch() before waiting for a reply"
        poller.register(monitor, zmq.POLLIN)
        while not box:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0 or not poller.poll(left_ms):
                return None
            if monitor.poll(0):
                self._on_lost(monitor)
            while self._sock.poll(0):
                msg = self._sock.recv()
                if isinstance(msg, p.ProtocolError):
                    msg = p.Error(msg.code, msg.message, msg.request_id)
                rid = request_id_of(msg)
                if rid is None or rid in self._open:  # else: a finished request's late mail
                    self._mail[rid].append(msg)
        return box.popleft()

    def _watch(self) -> None:
        """Watch the connection (before a request or call is sent): a close seen from
        now on fails every open request at once (``_on_lost``)."""
        if self._monitor is None:
            self._monitor = monitor_socket(self._sock.sock, _LOST_EVENTS)

    def _unwatch(self, force: bool = False) -> None:
        """Stop watching once nothing waits for a reply (``force``: on close).

        Nobody reads the monitor while the client idles, and libzmq sends each event
        from the context's I/O thread with a blocking send: an idle client whose
        connection keeps failing (a router away, wrong keys: a few events every
        reconnect) would fill the monitor's queue (1,000 events) and then stall every
        socket of the process (common.transport.close_monitor). Unwatched, an idle
        client holds no queue at all, and a close while it idled (a router restart:
        ZeroMQ reconnects by itself) cannot fail its next request."""
        if self._monitor is not None and (force or not self._open):
            close_monitor(self._sock.sock, self._monitor)
            self._monitor = None

    def _on_lost(self, monitor: zmq.Socket) -> None:
        """The connection closed: every open request fails now (none can be answered)."""
        events = []
        while monitor.poll(0):
            events.append(recv_monitor_message(monitor)["event"])
        refused = any(e & _REFUSED for e in events)
        why = "refused our handshake (wrong or missing keys?)" if refused else "closed"
        for rid in self._open:
            self._mail[rid].append(
                p.Error(
                    p.ROUTER_LOST,
                    f"the connection to the router {self.address} {why} while the request "
                    "ran (router stopped or restarted, or the request was too large): it "
                    "is lost; submit it again",
                    rid,
                )
            )
        self._open.clear()


class Stream:
    """Iterate for Deltas; ``result`` holds the finished Result afterwards. Leaving
    the iteration before the end (``break``, an exception in the loop's body)
    cancels the request, as the AsyncClient does: its worker's slot is freed."""

    def __init__(self, client: Client, submit: p.Submit) -> None:
        self.client = client
        self.submit = submit
        self.request_id = submit.request_id
        self._asm = Assembly(submit.request_id)
        self._accepted = False
        self._send_with_retry()

    @property
    def result(self) -> Result:
        if self._asm.result is None:
            raise TandemError("the stream has not finished yet")
        return self._asm.result

    def __iter__(self) -> Iterator[Delta]:
        c = self.client
        rid = self.request_id
        if self._asm.result is None and rid not in c._open and not c._mail.get(rid):
            raise TandemError("this stream was left before its end: its request was cancelled")
        try:
            while self._asm.result is None:
                msg = c._next(rid, c.timeout_s)
                if msg is None:
                    c.cancel(rid)
                    self._close()
                    raise RequestTimeout(f"no reply for {c.timeout_s}s", rid)
                try:
                    delta = self._asm.apply(msg)
                except TandemError:
                    self._close()
                    raise
                if delta is not None:
                    yield delta
            self._close()  # finished
        finally:
            if rid in c._open:  # the caller left mid-stream: free the worker's slot
                if not c._sock.sock.closed:
                    c.cancel(rid)
                self._close()

    def _close(self) -> None:
        """Finished or failed: forget its mailbox; late messages for it are dropped."""
        self.client._open.discard(self.request_id)
        self.client._mail.pop(self.request_id, None)
        self.client._unwatch()

    def _send_with_retry(self) -> None:
        """Send; if nothing comes back in time, probe the router. Alive: the request
        waits there (e.g. for a first worker). Silent: send again on a fresh socket."""
        c = self.client
        try:
            for _attempt in range(c.retries + 1):
                c._open.add(self.request_id)
                c._watch()
                c._send(self.submit)
                msg = c._next(self.request_id, c.connect_timeout_s)
                if msg is not None:
                    c._mail[self.request_id].appendleft(msg)  # Accepted (or Error): iter reads it
                    return
                c._sock.send(p.Hello(name="tandem-client"))
                if c._next(None, c.connect_timeout_s) is not None:
                    return  # the router is alive and holds the request
                c._reconnect()
        except BaseException:
            self._close()  # e.g. BadRequest (too large): nothing stays open or watched
            raise
        self._close()
        raise RequestTimeout(f"the router at {c.address} did not accept the request")
