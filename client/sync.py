"""The blocking client. One socket per Client; not thread-safe (use one per thread)."""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict, deque
from collections.abc import Callable
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
from tandem.client.session import Result, make_submit, request_id_of
from tandem.client.stream import Stream
from tandem.client.watch import LOST, NO_ROUTER_S, REFUSED, Link, attach, stop_retrying
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
    HandshakeRefused. No send blocks past ``connect_timeout_s``. A call that finds
    no connection to the router for ``no_router_s`` (nothing listens at the
    address) fails with RouterUnavailable, naming the address and how to start one.
    ``on_wait``: called with the router's StatusReply when a request is not
    accepted within ``WAIT_NOTICE_S`` (it waits there, e.g. for a first worker).
    """

    def __init__(
        self,
        address: str | None = None,
        timeout_s: float = 300.0,
        connect_timeout_s: float = 10.0,
        retries: int = 2,
        keys: str | None = None,
        no_router_s: float = NO_ROUTER_S,
        on_wait: Callable[[p.StatusReply], None] | None = None,
    ) -> None:
        self.address = address or addresses().client
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.retries = retries
        self.on_wait = on_wait
        self._setup = peer_setup(keys, "client")
        self._mail: dict[str | None, deque[p.Message]] = defaultdict(deque)
        self._open: set[str] = set()  # request ids in flight: mail for others is dropped
        # Across reconnects: a refused handshake stays refused.
        self._link = Link(self.address, self._setup is not None, no_router_s)
        self._connect()

    def _connect(self) -> None:
        self._monitor: zmq.Socket | None = None
        self._link.went_down()

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
        seed, stop, ignore_eos, presence_penalty, frequency_penalty,
        repetition_penalty, min_p, logit_bias ({token id: bias}), logprobs (n: each
        Delta's and the Result's ``logprobs`` then hold a TokenLogprob per token),
        json_schema (JSON Schema text the output must match), worker, prefill_only,
        request_id. A request needing what no worker serves raises BadRequest.
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
            self._mail.pop(None, None)  # a late reply to an earlier call is not this one's
            since = time.monotonic()
            self._send(msg)
            reply = self._next(None, self.connect_timeout_s, since)
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

    def _next(
        self, request_id: str | None, timeout_s: float, since: float | None = None
    ) -> p.Message | None:
        """The next message for ``request_id`` (None: replies without an id), or None
        after ``timeout_s``. ``since``: when the call began; RouterUnavailable once
        the connection has been down for ``no_router_s`` of that time."""
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
            wait_s = deadline - time.monotonic()
            if wait_s <= 0:
                return None
            if since is not None:
                wait_s = self._link.bounded(since, wait_s)
            poller.poll(int(wait_s * 1000) + 1)
            if monitor.poll(0):
                self._on_events(monitor)
            missing = None if since is None else self._link.absent(since)
            if missing is not None:
                self._link.restart(self._sock.sock)  # what it queued must not run later
                raise missing
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
        if self._link.refused is None and self._monitor is not None and self._monitor.poll(0):
            self._on_events(self._monitor)
        if self._link.refused is not None:
            raise HandshakeRefused(self._link.refused.message)

    def _on_events(self, monitor: zmq.Socket) -> None:
        """Read the connection's events. A close fails every open request now (none
        can be answered); a refused handshake fails the client itself, and the call
        waiting without a request id (``_call``) too."""
        kinds = set()
        while monitor.poll(0):
            kinds.add(self._link.read(monitor.recv_multipart()))
        refused = self._link.refused
        if REFUSED in kinds and refused is not None:
            stop_retrying(self._sock.sock, self.address)
            code, why, waiting = HANDSHAKE_REFUSED, refused.message, (*self._open, None)
        elif LOST in kinds:
            code, waiting = p.ROUTER_LOST, tuple(self._open)
            why = (
                f"the connection to the router {self.address} closed while the request ran "
                "(router stopped or restarted, or the request was too large): it is lost; "
                "submit it again"
            )
        else:  # the connection opened: nothing failed
            return
        for rid in waiting:
            self._mail[rid].append(p.Error(code, why, rid))
        self._open.clear()
