"""Bad input never crashes the router or a worker, and gets a clear error."""

from __future__ import annotations

import msgpack
import pytest
import zmq

from tandem.client import BadRequest, Client, NoWorkers, PromptTooLong
from tandem.common import protocol as p
from tests.helpers import needs_llama

pytestmark = [needs_llama, pytest.mark.model]

V = p.PROTOCOL_VERSION


def _raw(addr: str, frame: bytes, timeout_ms: int = 5000) -> p.Message:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(addr)
    try:
        sock.send(frame)
        assert sock.poll(timeout_ms), "no reply"
        return p.decode(sock.recv())
    finally:
        sock.close()


def _still_serves(cluster) -> None:
    with cluster.client() as c:
        assert c.generate("Still alive?", max_tokens=2).finish_reason in ("length", "eos")


@pytest.mark.parametrize(
    ("kwargs", "err", "needle"),
    [
        ({"prompt": ""}, BadRequest, "empty"),
        ({"prompt": "hi", "max_tokens": 0}, BadRequest, "max_tokens"),
        ({"prompt": "hi", "max_tokens": 100000}, PromptTooLong, "exceeds"),
        ({"prompt": "word " * 5000}, PromptTooLong, "exceeds"),
        ({"tokens": [1, 2, 10**7]}, BadRequest, "vocabulary"),
        ({"prompt": "hi", "top_p": 0.0}, BadRequest, "top_p"),
        ({"prompt": "hi", "temperature": -1.0}, BadRequest, "temperature"),
        ({"prompt": "hi", "worker": "no-such-worker"}, NoWorkers, "no-such-worker"),
        ({"messages": [{"role": "user"}]}, BadRequest, "content"),
    ],
)
def test_invalid_requests_get_typed_errors(cluster, kwargs, err, needle):
    with cluster.client() as c, pytest.raises(err) as info:
        c.generate(**kwargs)
    assert needle in str(info.value).lower()


def test_malformed_frames_get_error_replies(cluster):
    addr = cluster.client_addr
    V = p.PROTOCOL_VERSION
    cases = {
        b"\xc1 definitely not msgpack": p.BAD_FRAME,
        msgpack.packb([1, 2, 3]): p.BAD_FRAME,
        msgpack.packb({"v": V, "type": "no_such_type"}): p.BAD_FRAME,
        msgpack.packb({"v": 99, "type": "hello"}): p.VERSION_MISMATCH,
        msgpack.packb({"v": V, "type": "submit", "request_id": "x", "prompt": 5}): p.BAD_REQUEST,
        msgpack.packb(
            {"v": V, "type": "submit", "request_id": "x", "prompt": "a", "bogus": 1}
        ): p.BAD_REQUEST,
        msgpack.packb({"v": V, "type": "submit", "prompt": "a"}): p.BAD_REQUEST,
        p.encode(
            p.Heartbeat("w", 1, [], [], 0, 0, p.CacheReport(True, 1))
        ): p.BAD_REQUEST,  # wrong socket
    }
    for frame, code in cases.items():
        reply = _raw(addr, frame)
        assert isinstance(reply, p.Error), frame
        assert reply.code == code, (frame, reply)
    _still_serves(cluster)


def test_unknown_peers_on_the_worker_socket(cluster):
    # A heartbeat from a worker the router never met: told to register.
    reply = _raw(
        cluster.worker_addr, p.encode(p.Heartbeat("ghost", 1, [], [], 0, 0, p.CacheReport(True, 1)))
    )
    assert isinstance(reply, p.Reregister)
    # Garbage on the worker socket: an error reply, nothing else.
    reply = _raw(cluster.worker_addr, b"\x00\x01garbage")
    assert isinstance(reply, p.Error) and reply.code == p.BAD_FRAME
    # A Ready with a broken tokenizer is refused, and the real worker is untouched.
    bad = p.Ready("intruder", "x", "cpu", "other-model.gguf", 4, 4096, 16, 1.0, [1.0], 0.5, {})
    reply = _raw(cluster.worker_addr, p.encode(bad))
    assert isinstance(reply, p.Error) and reply.code == p.BAD_REQUEST
    with cluster.client() as c:
        assert [w["id"] for w in c.status().workers] == ["cpu0"]
    _still_serves(cluster)


def test_a_worker_rejects_bad_assignments_and_keeps_serving(cluster):
    """Reach the worker's own checks by pinning a request the router cannot vet."""
    with Client(cluster.client_addr) as c:
        with pytest.raises(BadRequest):
            c.generate(tokens=[], max_tokens=2)
        r = c.generate(tokens=[504, 3458], max_tokens=2)
    assert r.finish_reason in ("length", "eos")
    _still_serves(cluster)
