"""The worker's I/O thread against a bare ROUTER socket: heartbeats are repeated
while the compute thread is busy, and no longer once it has been silent for
``stall_s`` (a stuck worker must let the router expire it)."""

from __future__ import annotations

import queue
import threading
import time
import uuid

from tandem.common import protocol as p
from tandem.common.transport import RouterSocket
from tandem.workers.io import WorkerLink, start_link
from tests.helpers import tiny_tokenizer

HB_S = 0.05


def heartbeats_within(router: RouterSocket, seconds: float) -> int:
    n, end = 0, time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        if router.sock.poll(int(left * 1000)):
            _, msg = router.recv()
            n += isinstance(msg, p.Heartbeat)
    return n


def test_heartbeats_are_repeated_for_a_busy_compute_thread_but_not_a_stuck_one() -> None:
    address = f"inproc://link-{uuid.uuid4().hex}"
    router = RouterSocket(address)
    ready = p.Ready("w", "sim", "sim-w", "m.gguf", 4, 8192, 16, 100.0, [50.0], HB_S,
                    tiny_tokenizer())  # fmt: skip
    link = WorkerLink(address, ready, queue.Queue(), stall_s=0.6)
    stop = threading.Event()
    thread = start_link(link, stop)
    try:
        assert router.sock.poll(2000)
        identity, msg = router.recv()
        assert isinstance(msg, p.Ready)
        router.send(identity, p.Welcome(policy="phase_cost"))
        assert link.registered.wait(2)
        link.emit(
            p.Heartbeat("w", 1, [], [], 0, 8192, p.CacheReport(False, 1, base=1))
        )  # then the compute thread is busy
        assert heartbeats_within(router, 0.4) >= 3  # repeated: a long step is not death
        time.sleep(0.6)  # silent well past stall_s: stuck
        while router.sock.poll(0):
            router.recv()  # what was repeated before the stall
        assert heartbeats_within(router, 0.5) == 0
        link.emit(
            p.Heartbeat("w", 2, [], [], 0, 8192, p.CacheReport(False, 1, base=1))
        )  # it speaks again
        assert heartbeats_within(router, 0.3) >= 2
    finally:
        stop.set()
        thread.join(timeout=2)
        router.close()


def test_what_waits_together_leaves_as_one_frame_and_a_done_never_overtakes_tokens() -> None:
    """Messages emitted while the I/O thread is away (here: not started yet) are found
    waiting together: they go out as one batch, in order, consecutive deltas as one
    StepTokens entry, so the Done emitted after them follows them instead of
    overtaking them; a heartbeat goes alone, after what came before it."""
    address = f"inproc://link-{uuid.uuid4().hex}"
    router = RouterSocket(address)
    ready = p.Ready("w", "sim", "sim-w", "m.gguf", 4, 8192, 16, 100.0, [50.0], HB_S,
                    tiny_tokenizer())  # fmt: skip
    link = WorkerLink(address, ready, queue.Queue())
    first = [p.TokenDelta(f"r{i % 3}", [i], f"t{i}") for i in range(7)]
    done = p.Done("r0", p.FinishReason.LENGTH, p.DoneStats(output_tokens=3))
    for msg in [*first, done, p.TokenDelta("r1", [99], "!")]:
        link.emit(msg)
    stop = threading.Event()
    thread = start_link(link, stop)
    try:
        assert router.sock.poll(2000)
        identity, msg = router.recv()
        assert isinstance(msg, p.Ready)
        assert router.sock.poll(2000)
        batch = router.recv()[1]
        assert isinstance(batch, p.Batch)
        step, got_done, last = p.entries(batch)
        assert isinstance(step, p.StepTokens) and step.deltas() == first
        assert got_done == done and last == p.TokenDelta("r1", [99], "!")
        router.send(identity, p.Welcome(policy="phase_cost"))
        assert link.registered.wait(2)
        hb = p.Heartbeat("w", 1, [], [], 0, 8192, p.CacheReport(False, 1, base=1))
        for msg in [p.TokenDelta("r2", [5], "a"), hb, p.TokenDelta("r2", [6], "b")]:
            link.emit(msg)
        got = []
        while len(got) < 3 and router.sock.poll(2000):
            got.append(router.recv()[1])
        assert got[:2] == [p.TokenDelta("r2", [5], "a"), hb]  # tokens alone: a plain frame
        assert p.TokenDelta("r2", [6], "b") in got[2:] or (
            router.sock.poll(2000) and router.recv()[1] == p.TokenDelta("r2", [6], "b")
        )
    finally:
        stop.set()
        thread.join(timeout=2)
        router.close()
