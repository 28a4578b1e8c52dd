"""The asyncio client: one socket, a reader task fanning replies out per request."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import zmq
import zmq.asyncio

from tandem.client.errors import RequestTimeout, TandemError, from_error
from tandem.client.session import Assembly, Delta, Result, make_submit, request_id_of
from tandem.common import protocol as p
from tandem.common.auth import peer_setup
from tandem.common.settings import addresses
from tandem.common.transport import CLIENT_FRAME_BYTES, close_monitor, monitor_socket

DRAIN_MAX = 255  # messages read per wake-up beyond the first
WATCH_S = 1.0  # the longest a closed connection goes unnoticed


class AsyncClient:
    """Many concurrent requests over one connection; use inside a running loop."""

    def __init__(
        self, address: str | None = None, timeout_s: float = 300.0, keys: str | None = None
    ) -> None:
        self.address = address or addresses().client
        self.timeout_s = timeout_s
        self._ctx = zmq.asyncio.Context.instance()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.MAXMSGSIZE, CLIENT_FRAME_BYTES)
        setup = peer_setup(keys, "client")  # CURVE, when the router uses keys
        if setup is not None:
            setup(self._sock)
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
        self._sock.disable_monitor()  # before the socket goes (common.transport.close_monitor)
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
            sent = self._sock.send(p.encode(p.Cancel(request_id)), zmq.NOBLOCK)
        except zmq.ZMQError:  # socket closed: nothing left to cancel through
            return
        # A full queue fails the future (EAGAIN); read its outcome so asyncio does not warn.
        sent.add_done_callback(lambda f: f.cancelled() or f.exception())

    async def status(self) -> p.StatusReply:
        box = self._box(None)
        while not box.empty():  # a reply to an earlier status call that timed out
            box.get_nowait()
        await self._sock.send(p.encode(p.StatusQuery()))
        msg = await self._get(box, None)
        if isinstance(msg, p.Error):
            raise from_error(msg)
        if not isinstance(msg, p.StatusReply):
            raise TandemError(f"unexpected reply {msg.TYPE}")
        return msg

    async def _run(
        self, prompt: str | None, kwargs: dict, out: dict, accepted: bool = False
    ) -> AsyncIterator[Any]:
        """Deltas of one request (and its Accepted first, with ``accepted``)."""
        kwargs.setdefault("stream", True)
        submit = make_submit(prompt, **kwargs)
        rid = submit.request_id
        box = self._box(rid)
        asm = out["asm"] = Assembly(rid)
        await self._sock.send(p.encode(submit))
        ended = False  # done, or failed: the router holds nothing to cancel
        try:
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
        finally:
            self._boxes.pop(rid, None)
            if not ended:  # the caller left early: free the worker's slot
                self.cancel(rid)

    def _box(self, rid: str | None) -> asyncio.Queue[p.Message]:
        if self._reader is None or self._reader.done():
            self._reader = asyncio.get_running_loop().create_task(self._read())
        if self._watcher is None or self._watcher.done():
            # The monitor attaches now, before the first request leaves: a router that
            # answers and dies at once must not close the connection unobserved. Only
            # when no watcher lives: a socket has one monitor, and a second would
            # replace the first, whose watcher would then stop the new one as it ends.
            monitor = monitor_socket(self._sock, zmq.EVENT_DISCONNECTED)
            self._watcher = asyncio.get_running_loop().create_task(self._watch(monitor))
        return self._boxes.setdefault(rid, asyncio.Queue())

    async def _watch(self, monitor: zmq.asyncio.Socket) -> None:
        """A closed connection fails every open request at once (RouterLost)."""
        try:
            while True:
                # Wake at least every WATCH_S and ask the socket itself: an asyncio
                # wake-up rides on zmq's edge-triggered descriptor and can be missed
                # (seen once in CI: a request waited out its timeout after the close).
                await monitor.poll(WATCH_S * 1000)
                if not monitor.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                    continue
                await monitor.recv_multipart()
                for rid, box in self._boxes.items():
                    if rid is not None:
                        box.put_nowait(
                            p.Error(p.ROUTER_LOST, "the connection to the router closed", rid)
                        )
        finally:  # also when the loop ends without close(): the socket may still be open
            close_monitor(self._sock, monitor)

    async def _get(self, box: asyncio.Queue[p.Message], rid: str | None) -> p.Message:
        if not box.empty():  # tokens often arrive in bursts: skip wait_for's task and timer
            return box.get_nowait()
        try:
            return await asyncio.wait_for(box.get(), self.timeout_s)
        except TimeoutError:
            if rid is not None:
                await self._sock.send(p.encode(p.Cancel(rid)))
            raise RequestTimeout(f"no reply for {self.timeout_s}s", rid) from None

    async def _read(self) -> None:
        while True:
            frames = [await self._sock.recv()]
            # A worker step sends one token per running request at once: take the rest
            # of such a burst with non-blocking reads, which skip the awaitable's wait
            # machinery (its cost per message is most of this client's CPU per token).
            for _ in range(DRAIN_MAX):
                try:
                    frames.append(self._sock.recv(zmq.NOBLOCK).result())
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
