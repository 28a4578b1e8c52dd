"""The asyncio client: one socket, a reader task fanning replies out per request."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, TypeAlias, cast

import zmq
import zmq.asyncio

from tandem.client.errors import (
    HANDSHAKE_REFUSED,
    HandshakeRefused,
    RequestTimeout,
    RouterLost,
    RouterUnavailable,
    TandemError,
    from_error,
)
from tandem.client.session import Assembly, Delta, Result, make_submit, request_id_of
from tandem.client.watch import LOST, NO_ROUTER_S, REFUSED, Link, attach, stop_retrying
from tandem.common import protocol as p
from tandem.common.auth import peer_setup
from tandem.common.settings import addresses
from tandem.common.transport import CLIENT_FRAME_BYTES, close_monitor

# pyzmq's asyncio socket answers each call with an asyncio Future, which its stubs type
# as a bare Awaitable; a NOBLOCK call's is done at once, so it is read without awaiting.
Sent: TypeAlias = asyncio.Future["zmq.MessageTracker | None"]
Received: TypeAlias = asyncio.Future[bytes]
ReceivedParts: TypeAlias = asyncio.Future[list[bytes]]
DRAIN_MAX = 255  # messages read per wake-up beyond the first
WATCH_S = 1.0  # the longest a closed connection goes unnoticed
SEND_POLL_MS = 100  # while a send waits for the connection: how often a refusal is checked


class AsyncClient:
    """Many concurrent requests over one connection; use inside a running loop.

    A closed connection fails the requests in flight at once (RouterLost); a refused
    handshake (keys, docs/SECURITY.md) fails every pending and later call at once
    (HandshakeRefused). No send waits past ``timeout_s``. A call that finds no
    connection to the router for ``no_router_s`` (nothing listens at the address)
    fails with RouterUnavailable, naming the address and how to start one.
    """

    def __init__(
        self,
        address: str | None = None,
        timeout_s: float = 300.0,
        keys: str | None = None,
        no_router_s: float = NO_ROUTER_S,
    ) -> None:
        self.address = address or addresses().client
        self.timeout_s = timeout_s
        self._ctx: zmq.asyncio.Context = zmq.asyncio.Context.instance()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.MAXMSGSIZE, CLIENT_FRAME_BYTES)
        setup = peer_setup(keys, "client")  # CURVE, when the router uses keys
        if setup is not None:
            setup(self._sock)
        self._link = Link(self.address, setup is not None, no_router_s)
        self._monitor = attach(self._sock)  # before connect: a refusal comes at once
        self._sock.connect(self.address)
        self._boxes: dict[str | None, asyncio.Queue[p.Message]] = {}
        self._reader: asyncio.Task[None] | None = None
        self._watcher: asyncio.Task[None] | None = None

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._reader:
            self._reader.cancel()
        if self._watcher:
            self._watcher.cancel()
        close_monitor(self._sock, self._monitor)  # before the socket goes
        self._sock.close(linger=0)

    async def generate(self, prompt: str | None = None, **kwargs: Any) -> Result:
        out: dict[str, Assembly] = {}
        async for _ in self._run(prompt, kwargs, out):
            pass
        asm = out["asm"]
        assert asm.result is not None
        return asm.result

    async def stream(self, prompt: str | None = None, **kwargs: Any) -> AsyncIterator[Delta]:
        """Yields Deltas; the final Result is not returned (use generate for stats)."""
        async for delta in self._run(prompt, kwargs, {}):
            yield delta

    async def events(
        self, prompt: str | None = None, **kwargs: Any
    ) -> AsyncIterator[p.Accepted | Delta | Result]:
        """Yields the router's Accepted (worker chosen, prompt tokens; errors found
        before routing raise instead), the Deltas as they arrive, then the final
        Result (usage, finish reason).

        Every call takes a prompt (or ``tokens=``/``messages=``) and the fields of
        ``make_submit``, or ``submit=``: a Submit already built by ``make_submit``
        (built and checked once, as the gateway does for each HTTP request).

        Leaving the loop early (break, task cancelled) cancels the request."""
        out: dict[str, Assembly] = {}
        run = self._run(prompt, kwargs, out, accepted=True)
        try:
            async for delta in run:
                yield delta
        finally:  # closing this generator closes _run now, not when it is collected
            await run.aclose()
        result = out["asm"].result
        assert result is not None
        yield result

    def cancel(self, request_id: str) -> None:
        """Ask the router to stop ``request_id`` (idempotent). Sends without awaiting, so
        it also works from cleanup code running inside a cancelled task."""
        try:
            sent = cast(Sent, self._sock.send(p.encode(p.Cancel(request_id)), zmq.NOBLOCK))
        except zmq.ZMQError:  # socket closed: nothing left to cancel through
            return
        # A full queue fails the future (EAGAIN); read its outcome so asyncio does not warn.
        sent.add_done_callback(lambda f: f.cancelled() or f.exception())

    async def status(self) -> p.StatusReply:
        box = self._box(None)
        while not box.empty():  # a reply to an earlier status call that timed out
            box.get_nowait()
        await self._send(p.encode(p.StatusQuery()))
        msg = await self._get(box, None)
        if isinstance(msg, p.Error):
            raise from_error(msg)
        if not isinstance(msg, p.StatusReply):
            raise TandemError(f"unexpected reply {msg.TYPE}")
        return msg

    async def _run(
        self, prompt: str | None, kwargs: dict, out: dict, accepted: bool = False
    ) -> AsyncGenerator[Any, None]:
        """Deltas of one request (and its Accepted first, with ``accepted``)."""
        submit = kwargs.pop("submit", None)
        if submit is None:
            kwargs.setdefault("stream", True)
            submit = make_submit(prompt, **kwargs)
        elif prompt is not None or kwargs:
            raise TypeError("give submit= alone: it already holds the prompt and its fields")
        rid = submit.request_id
        box = self._box(rid)
        asm = out["asm"] = Assembly(rid)
        ended = False  # done, or failed: the router holds nothing to cancel
        try:
            await self._send(p.encode(submit))
            while asm.result is None:
                msg = await self._get(box, rid)
                try:
                    delta = asm.apply(msg)
                except TandemError:
                    ended = True
                    raise
                if delta is not None:
                    yield delta
                elif accepted and isinstance(msg, p.Accepted):
                    yield msg
            ended = True
        except RouterUnavailable:
            ended = True  # its socket was reconnected: the request went nowhere
            raise
        finally:
            self._boxes.pop(rid, None)
            if not ended:  # the caller left early: free the worker's slot
                self.cancel(rid)

    def _box(self, rid: str | None) -> asyncio.Queue[p.Message]:
        if self._reader is None or self._reader.done():
            self._reader = asyncio.get_running_loop().create_task(self._read())
        if self._watcher is None or self._watcher.done():
            # What the connection did while nobody watched: a refusal counts, a close
            # lost nothing (no request was open).
            self._events(lost=False)
            self._watcher = asyncio.get_running_loop().create_task(self._watch())
        if self._link.refused is not None:
            raise HandshakeRefused(self._link.refused.message)
        return self._boxes.setdefault(rid, asyncio.Queue())

    async def _watch(self) -> None:
        """A closed connection fails every open request at once (RouterLost)."""
        monitor = self._monitor
        while True:
            # Wake at least every WATCH_S and ask the socket itself: an asyncio
            # wake-up rides on zmq's edge-triggered descriptor and can be missed
            # (seen once in CI: a request waited out its timeout after the close).
            await monitor.poll(WATCH_S * 1000)
            self._events(lost=True)

    def _events(self, lost: bool) -> None:
        """Read the monitor's waiting events: a refused handshake fails every box and
        the client for good; a close (``lost``) fails the open requests."""
        while cast(int, self._monitor.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
            frames = cast(ReceivedParts, self._monitor.recv_multipart(zmq.NOBLOCK))
            kind = self._link.read(frames.result())
            refused = self._link.refused
            if kind == REFUSED and refused is not None:
                stop_retrying(self._sock, self.address)
                self._fail_all(HANDSHAKE_REFUSED, refused.message, with_status=True)
            elif kind == LOST and lost:
                self._fail_all(p.ROUTER_LOST, "the connection to the router closed")

    def _fail_all(self, code: p.ErrorCode, message: str, with_status: bool = False) -> None:
        for rid, box in self._boxes.items():
            if rid is not None or with_status:
                box.put_nowait(p.Error(code, message, rid))

    async def _send(self, frame: bytes) -> None:
        """Send once the connection takes it: at once on a refused handshake, and
        after ``timeout_s`` at the latest, it fails instead (a connection dropped
        after a refusal takes nothing, ever)."""
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        while True:
            if self._link.refused is not None:
                raise HandshakeRefused(self._link.refused.message)
            failed = cast(Sent, self._sock.send(frame, zmq.NOBLOCK)).exception()
            if failed is None:
                return
            if not isinstance(failed, zmq.Again):  # e.g. the socket is closed
                raise failed
            if asyncio.get_running_loop().time() > deadline:
                raise RouterLost(
                    f"the connection to the router at {self.address} took no message "
                    f"for {self.timeout_s}s (the router is away or does not read)"
                )
            # pyzmq 27's stub gives this socket the Poller's poll(timeout); it takes flags
            await self._sock.poll(SEND_POLL_MS, zmq.POLLOUT)  # type: ignore[call-arg]

    async def _get(self, box: asyncio.Queue[p.Message], rid: str | None) -> p.Message:
        """The box's next message; RouterUnavailable once the connection has been
        down for ``no_router_s`` of this wait, RequestTimeout after ``timeout_s``."""
        if not box.empty():  # tokens often arrive in bursts: skip wait_for's task and timer
            return box.get_nowait()
        since = time.monotonic()
        deadline = since + self.timeout_s
        while True:
            wait_s = deadline - time.monotonic()
            try:
                return await asyncio.wait_for(box.get(), self._link.bounded(since, wait_s) + 1e-3)
            except TimeoutError:
                pass
            self._events(lost=True)  # what the watcher would read on its next wake-up
            missing = self._link.absent(since)
            if missing is not None:
                self._link.restart(self._sock)  # what it queued must not run later
                raise missing from None
            if time.monotonic() >= deadline:
                if rid is not None:
                    self.cancel(rid)
                raise RequestTimeout(f"no reply for {self.timeout_s}s", rid) from None

    async def _read(self) -> None:
        while True:
            frames = [await self._sock.recv()]
            # A worker step sends one token per running request at once: take the rest
            # of such a burst with non-blocking reads, which skip the awaitable's wait
            # machinery (its cost per message is most of this client's CPU per token).
            for _ in range(DRAIN_MAX):
                try:
                    frames.append(cast(Received, self._sock.recv(zmq.NOBLOCK)).result())
                except zmq.Again:
                    break
            for frame in frames:
                self._deliver(frame)

    def _deliver(self, frame: bytes) -> None:
        try:
            msgs = p.decode_all(frame)  # one message, or a batch's in order
        except p.ProtocolError as exc:
            msgs = [exc]
        for msg in msgs:
            if isinstance(msg, p.ProtocolError):
                msg = p.Error(msg.code, msg.message, msg.request_id)
            box = self._boxes.get(request_id_of(msg))
            if box is not None:
                box.put_nowait(msg)
