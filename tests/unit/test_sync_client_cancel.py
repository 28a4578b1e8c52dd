"""The sync Client against a scripted router socket: leaving a stream early sends
Cancel (as the AsyncClient does), a finished one does not, and the left stream
says so if iterated again."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import zmq

from tandem.client.errors import TandemError
from tandem.client.sync import Client
from tandem.common import protocol as p


def _router(address: str, ready: threading.Event, seen: list[p.Message]) -> None:
    """Answers r1 with Accepted and two tokens, r2 with Accepted and Done, then records
    what else comes for 1 s."""
    sock = zmq.Context.instance().socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(address)
    ready.set()
    try:
        while sock.poll(1000):
            who, frame = sock.recv_multipart()
            msg = p.decode(frame)
            seen.append(msg)
            if isinstance(msg, p.Submit) and msg.request_id == "r1":
                for out in (p.Accepted("r1", "w", 1), p.TokenDelta("r1", [7], "a"),
                            p.TokenDelta("r1", [8], "b")):  # fmt: skip
                    sock.send_multipart([who, p.encode(out)])
            elif isinstance(msg, p.Submit):
                for out in (p.Accepted(msg.request_id, "w", 1),
                            p.Done(msg.request_id, "length")):  # fmt: skip
                    sock.send_multipart([who, p.encode(out)])
    finally:
        sock.close()


def test_leaving_a_stream_early_cancels_and_a_finished_one_does_not(tmp_path: Path) -> None:
    address = f"ipc://{tmp_path}/router.sock"
    ready, seen = threading.Event(), []
    thread = threading.Thread(target=_router, args=(address, ready, seen), daemon=True)
    thread.start()
    assert ready.wait(5)
    with Client(address, timeout_s=5.0, connect_timeout_s=5.0) as c:
        left = c.stream("hi", request_id="r1", max_tokens=8)
        for delta in left:
            assert delta.token_ids == [7]
            break  # the caller walks away mid-stream
        with pytest.raises(TandemError, match="left before its end"):
            next(iter(left))
        done = c.stream("hi", request_id="r2", max_tokens=1)
        assert list(done) == [] and done.result.finish_reason == "length"
        # Watched while idle too, on a queue libzmq never blocks on (client/watch.py).
        assert c._monitor is not None and c._monitor.getsockopt(zmq.RCVHWM) == 0
    thread.join(5)
    kinds = [(type(m).__name__, getattr(m, "request_id", None)) for m in seen]
    assert kinds == [("Submit", "r1"), ("Cancel", "r1"), ("Submit", "r2")]
