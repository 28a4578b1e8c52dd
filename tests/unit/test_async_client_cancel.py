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
            assert await first == Delta([7], "a")
            await events.aclose()  # the caller walks away mid-stream
            _, cancel = await router.recv()

            done = c.events("hi", request_id="r2", max_tokens=1)
            task = asyncio.ensure_future(anext(done))
            who, _ = await router.recv()
            router.send(who, p.Done("r2", "length", {}))
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
