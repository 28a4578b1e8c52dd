"""The twin's workers send what a real worker's link sends: the same frames, byte for
byte, for the same emitted messages (workers/frames.py is the one encoder), so a
change to a real token's path shows in the twin."""

from __future__ import annotations

import queue
import threading
import uuid

from tandem.common import protocol as p
from tandem.common.transport import RouterSocket
from tandem.twin.world import NO_DELAY, TwinWorker, World
from tandem.workers.device_model import SimProfile
from tandem.workers.engine import EngineConfig
from tandem.workers.io import WorkerLink, start_link
from tests.helpers import tiny_tokenizer

GPU = SimProfile("gpu", 2551.0, tuple(0.003413 * (1 + 0.1 * b) for b in range(8)))


def _is_heartbeat(frame: bytes) -> bool:
    return isinstance(p.decode(frame), p.Heartbeat)


def twin_step_frames() -> tuple[list[list[p.Message]], list[bytes]]:
    """A twin worker serving three requests at once: what its engine emitted at each
    step, and the frames it delivered to the router (heartbeats left out)."""
    world, delivered = World(), []
    cfg = EngineConfig(max_active=3, step_tokens=64, heartbeat_s=0.5)
    w = TwinWorker(world, "w", GPU, cfg, lambda wid, frames: delivered.extend(frames), NO_DELAY)
    steps: list[list[p.Message]] = []
    flush = w._flush

    def noting_flush() -> None:
        steps.append([m for m in w._out if not isinstance(m, p.Heartbeat)])
        flush()

    w._flush = noting_flush  # type: ignore[method-assign]
    for i in range(3):
        sampling = p.SamplingParams(2 + 2 * i, ignore_eos=True)
        w.receive(p.Assign(f"r{i}", [1, 2, 3, 4 + i], sampling))
    world.run()
    return [s for s in steps if s], [f for f in delivered if not _is_heartbeat(f)]


def link_frame(msgs: list[p.Message]) -> list[bytes]:
    """The frames a real worker's link (its I/O thread) sends when it finds ``msgs``
    waiting together: emitted before the thread starts, read after its Ready."""
    address = f"inproc://frames-{uuid.uuid4().hex}"
    router = RouterSocket(address)
    ready = p.Ready("w", "sim", "sim-w", "m.gguf", 4, 8192, 16, 100.0, [50.0], 0.5,
                    tiny_tokenizer())  # fmt: skip
    link = WorkerLink(address, ready, queue.Queue())
    for msg in msgs:
        link.emit(msg)
    stop = threading.Event()
    thread = start_link(link, stop)
    try:
        assert router.sock.poll(2000)
        assert isinstance(router.recv()[1], p.Ready)
        frames = []
        while router.sock.poll(200):  # what was waiting leaves at once, in one pass
            frames.append(router.sock.recv_multipart()[-1])
        return frames
    finally:
        stop.set()
        thread.join(timeout=2)
        router.close()


def test_a_twin_worker_sends_the_frames_a_real_workers_link_sends() -> None:
    steps, delivered = twin_step_frames()
    # The run went through each shape a step can take: tokens of several requests
    # (StepTokens), one request's alone (TokenDelta), tokens with a Done (a batch).
    kinds = {type(p.decode(f)) for f in delivered}
    assert {p.StepTokens, p.TokenDelta, p.Batch} <= kinds
    dones = [m for s in steps for m in s if isinstance(m, p.Done)]
    assert sorted(d.request_id for d in dones) == ["r0", "r1", "r2"]
    assert delivered == [f for step in steps for f in link_frame(step)]
