"""AsyncClient against a scripted router socket: leaving a stream early sends Cancel."""

from __future__ import annotations

import asyncio
from pathlib import Path

import zmq

from tandem.client.aio import AsyncClient
from tandem.client.session import Delta, Result
from tandem.common import protocol as p


class FakeRouter:
    """A ROUTER socket answering by hand (sync, on an ipc:// path of the test's own)."""

    def __init__(self, tmp_path: Path) -> None:
        self.address = f"ipc://{tmp_path}/router.sock"
        self.sock = zmq.Context.instance().socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(self.address)

    async def recv(self) -> tuple[bytes, p.Message]:
        for _ in range(200):  # up to ~2 s, without blocking the client's event loop
            if self.sock.poll(0):
                identity, frame = self.sock.recv_multipart()
                return identity, p.decode(frame)
            await asyncio.sleep(0.01)
        raise AssertionError("the client sent nothing")

    def send(self, identity: bytes, msg: p.Message) -> None:
        self.sock.send_multipart([identity, p.encode(msg)])


def test_leaving_a_stream_early_cancels_and_a_finished_one_does_not(tmp_path: Path) -> None:
    router = FakeRouter(tmp_path)

    async def run() -> list[p.Message]:
        async with AsyncClient(router.address, timeout_s=5.0) as c:
            events = c.events("hi", request_id="r1", max_tokens=8)
            first = asyncio.ensure_future(anext(events))
            who, submit = await router.recv()
            assert isinstance(submit, p.Submit) and submit.request_id == "r1"
            router.send(who, p.Accepted("r1", "w", 1))
            router.send(who, p.TokenDelta("r1", [7], "a"))
            assert await first == p.Accepted("r1", "w", 1)
            assert await anext(events) == Delta([7], "a")
            await events.aclose()  # the caller walks away mid-stream
            _, cancel = await router.recv()

            done = c.events("hi", request_id="r2", max_tokens=1)
            task = asyncio.ensure_future(anext(done))
            who, _ = await router.recv()
            router.send(who, p.Done("r2", "length"))
            assert isinstance(await task, Result)
            await done.aclose()  # finished: nothing to cancel
            await asyncio.sleep(0.1)
            late = [p.decode(router.sock.recv_multipart()[1])] if router.sock.poll(0) else []
            return [cancel, *late]

    try:
        sent = asyncio.run(run())
    finally:
        router.sock.close()
    assert sent == [p.Cancel("r1")]


def test_a_restarted_reader_keeps_the_one_watcher_and_a_close_still_fails_requests(
    tmp_path: Path,
) -> None:
    """The reader task may end on a live loop (here: cancelled); the next request
    starts a new reader but keeps the watcher that lives (a second monitor would
    replace the first, and its watcher would stop the new one as it ends), and the
    router going still fails the open request at once."""
    from tandem.client.errors import RouterLost

    router = FakeRouter(tmp_path)

    async def run() -> None:
        async with AsyncClient(router.address, timeout_s=30.0) as c:
            first = c.events("hi", request_id="r1", max_tokens=1)
            task = asyncio.ensure_future(anext(first))
            who, _ = await router.recv()
            router.send(who, p.Done("r1", "length"))
            assert isinstance(await task, Result)
            await first.aclose()
            watcher = c._watcher
            assert c._reader is not None
            c._reader.cancel()
            await asyncio.sleep(0.05)
            events = c.events("hi", request_id="r2", max_tokens=8)
            pending = asyncio.ensure_future(anext(events))
            await router.recv()
            assert c._watcher is watcher and not watcher.done()
            router.sock.close()  # the router goes mid-request
            try:
                await asyncio.wait_for(pending, 10.0)
            except RouterLost:
                return
            raise AssertionError("the open request did not fail when the router went")

    asyncio.run(run())
