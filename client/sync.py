"""The blocking client. One socket per Client; not thread-safe (use one per thread)."""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict, deque
from collections.abc import Iterator
from typing import Any

import zmq

from tandem.client.errors import (
    HANDSHAKE_REFUSED,
    BadRequest,
    HandshakeRefused,
    RequestTimeout,
    RouterLost,
    TandemError,
    from_error,
)
from tandem.client.session import Assembly, Delta, Result, make_submit, request_id_of
from tandem.client.watch import attach, refusal, stop_retrying
from tandem.common import protocol as p
from tandem.common.auth import peer_setup
from tandem.common.settings import addresses
from tandem.common.transport import CLIENT_FRAME_BYTES, DealerSocket, close_monitor


class Client:
    """Talks to a tandem router.

    ``timeout_s``: the longest silence tolerated while a request runs (no token,
    no reply); then the request is cancelled and RequestTimeout raised.
    ``connect_timeout_s`` / ``retries``: a request not accepted in time is sent
    again on a fresh socket (the router may have restarted), up to ``retries`` times.
    ``keys``: the CURVE keys folder when the router uses keys (default TANDEM_KEYS).
    When the connection drops mid-request the request fails at once with
    RouterLost instead of waiting out ``timeout_s``; when the router refuses our
    handshake (keys), every pending and later call fails at once with
    HandshakeRefused. No send blocks past ``connect_timeout_s``.
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
        self._refused: HandshakeRefused | None = None  # kept: no later call gets through
        self._connect()

    def _connect(self) -> None:
        self._monitor: zmq.Socket | None = None

        def setup(sock: zmq.Socket) -> None:  # before connect: a refusal comes at once
            if self._setup is not None:
                self._setup(sock)
            self._monitor = attach(sock)

        self._sock = DealerSocket(self.address, None, CLIENT_FRAME_BYTES, setup)

    def close(self) -> None:
        if self._monitor is not None:
            close_monitor(self._sock.sock, self._monitor)
            self._monitor = None
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
        """Ask the router to stop ``request_id`` (idempotent). Never blocks: a cancel
        the connection cannot take now is dropped (no connection, nothing to stop)."""
        with contextlib.suppress(zmq.ZMQError):
            self._sock.sock.send(p.encode(p.Cancel(request_id)), zmq.NOBLOCK)

    # ------------------------------------------------------------ plumbing
    def _call(self, msg: p.Message, expect: tuple[type, ...]) -> p.Message:
        """Request/reply without a request id, retried on a fresh socket (Lazy Pirate)."""
        for _attempt in range(self.retries + 1):
            self._check_connection()
            self._send(msg)
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

    def _reconnect(self) -> None:
        self.close()
        self._connect()

    def _send(self, msg: p.Message) -> None:
        """Send once the connection takes it, never blocking past ``connect_timeout_s``
        (a connection dropped after a refused handshake takes nothing, ever)."""
        rid = getattr(msg, "request_id", None)
        frame = p.encode(msg)
        if len(frame) > CLIENT_FRAME_BYTES:
            raise BadRequest(
                f"the request is {len(frame)} bytes; the router accepts at most "
                f"{CLIENT_FRAME_BYTES}",
                rid,
            )
        sock, deadline = self._sock.sock, time.monotonic() + self.connect_timeout_s
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLOUT)
        poller.register(self._monitor, zmq.POLLIN)
        while True:
            try:
                sock.send(frame, zmq.NOBLOCK)
                return
            except zmq.Again:
                pass
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                raise RouterLost(
                    f"the connection to the router at {self.address} took no message for "
                    f"{self.connect_timeout_s}s (the router is away or does not read)",
                    rid,
                )
            poller.poll(left_ms)
            self._check_connection()

    def _next(self, request_id: str | None, timeout_s: float) -> p.Message | None:
        """The next message for ``request_id`` (None: replies without an id)."""
        box = self._mail[request_id]
        if box:
            return box.popleft()
        deadline = time.monotonic() + timeout_s
        poller = zmq.Poller()
        poller.register(self._sock.sock, zmq.POLLIN)
        monitor = self._monitor
        assert monitor is not None
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

    def _check_connection(self) -> None:
        """Read the connection's events so far (``_on_lost``); raise if the router
        refused our handshake, now or before."""
        if self._refused is None and self._monitor is not None and self._monitor.poll(0):
            self._on_lost(self._monitor)
        if self._refused is not None:
            raise HandshakeRefused(self._refused.message)

    def _on_lost(self, monitor: zmq.Socket) -> None:
        """The connection closed: every open request fails now (none can be answered).
        A refused handshake fails the client itself, and the call waiting without a
        request id (``_call``) too."""
        refused = None
        while monitor.poll(0):
            event = refusal(self.address, monitor.recv_multipart(), self._setup is not None)
            refused = refused or event
        if refused is not None:
            self._refused = refused
            stop_retrying(self._sock.sock, self.address)
            code, why, waiting = HANDSHAKE_REFUSED, refused.message, (*self._open, None)
        else:
            code, waiting = p.ROUTER_LOST, tuple(self._open)
            why = (
                f"the connection to the router {self.address} closed while the request ran "
                "(router stopped or restarted, or the request was too large): it is lost; "
                "submit it again"
            )
        for rid in waiting:
            self._mail[rid].append(p.Error(code, why, rid))  # type: ignore[arg-type]
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

    def _send_with_retry(self) -> None:
        """Send; if nothing comes back in time, probe the router. Alive: the request
        waits there (e.g. for a first worker). Silent: send again on a fresh socket."""
        c = self.client
        try:
            for _attempt in range(c.retries + 1):
                c._check_connection()  # before it opens: an old close is not its loss
                c._open.add(self.request_id)
                c._send(self.submit)
                msg = c._next(self.request_id, c.connect_timeout_s)
                if msg is not None:
                    c._mail[self.request_id].appendleft(msg)  # Accepted (or Error): iter reads it
                    return
                c._send(p.Hello(name="tandem-client"))
                if c._next(None, c.connect_timeout_s) is not None:
                    return  # the router is alive and holds the request
                c._reconnect()
        except BaseException:
            self._close()  # e.g. BadRequest (too large): nothing stays open or watched
            raise
        self._close()
        raise RequestTimeout(f"the router at {c.address} did not accept the request")
