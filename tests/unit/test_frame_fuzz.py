"""The frame boundary, fuzzed the way it failed: values nested past any decoder's
recursion, huge, mistyped and truncated, in every field of every message type.

``protocol.decode`` (and a batch's ``entries``) must return a message or raise
ProtocolError with a known reason, never anything else: a frame nested 1,000 deep
in ``hello``'s ``v`` once raised RecursionError out of the router's loop.
"""

from __future__ import annotations

import queue
import threading
import uuid

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tandem.common import framescan
from tandem.common import protocol as p
from tandem.common.transport import RouterSocket
from tandem.workers.io import WorkerLink, start_link
from tests.helpers import tiny_tokenizer

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
TYPES = sorted(p.MESSAGE_TYPES)
HOLE = msgpack.packb("\x00hole\x00")  # where a raw (unpackable) value is spliced in
REASONS = set(p.Refusal)


def decoded_or_refused(frame: bytes) -> p.Message | p.ProtocolError:
    """What the boundary makes of ``frame``; fails the test on any other exception."""
    try:
        msg = p.decode(frame)
    except p.ProtocolError as exc:
        assert exc.reason in REASONS
        return exc
    if isinstance(msg, p.Batch):
        for entry in p.entries(msg):
            assert isinstance(entry, p.Message | p.ProtocolError)
    return msg


def nested(depth: int, leaf: bytes = b"\x01", as_map: bool = False) -> bytes:
    """A value ``depth`` containers deep, packed by hand (msgpack's packer stops at 512)."""
    return (b"\x81\xa1k" if as_map else b"\x91") * depth + leaf


def fields_of(tag: str) -> list[str]:
    return [n for n in p.MESSAGE_TYPES[tag].__struct_fields__ if n != "v"]


# Scalars at and past every edge msgpack can carry, then containers of them.
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.sampled_from([2**63 - 1, 2**64 - 1, -(2**63), 0, -1]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.binary(max_size=20),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=6),
        st.dictionaries(st.one_of(st.text(max_size=8), st.integers(-5, 5)), inner, max_size=6),
    ),
    max_leaves=30,
)


@st.composite
def frames(draw: st.DrawFn, in_batch: bool = False) -> bytes:
    """A frame (or batch entry) of any message type: each field kept, dropped, given
    an arbitrary value, or a hole spliced with a deep or huge value; then perhaps cut."""
    tag = draw(st.sampled_from(TYPES))
    body: dict[object, object] = (
        {} if in_batch else {"v": draw(st.sampled_from([p.PROTOCOL_VERSION, 4, None]))}
    )
    body["type"] = tag
    hole = None
    for name in fields_of(tag):
        what = draw(st.sampled_from(["drop", "value", "value", "hole"]))
        if what == "value":
            body[name] = draw(values)
        elif what == "hole" and hole is None:
            body[name] = "\x00hole\x00"
            hole = draw(
                st.one_of(
                    st.builds(nested, st.integers(90, 3000), st.just(b"\x01"), st.booleans()),
                    st.sampled_from(
                        [
                            b"\xdd\xff\xff\xff\xff",
                            b"\xdf\xff\xff\xff\xff",
                            b"\xdb\xff\xff\xff\xff",
                            b"\xc6\x7f\xff\xff\xff",
                        ]
                    ),  # fmt: skip
                )
            )
    if draw(st.booleans()):  # the order of keys changes what msgspec skips to find "type"
        body = dict(reversed(list(body.items())))
    frame = msgpack.packb(body, use_bin_type=True)
    if hole is not None:
        frame = frame.replace(HOLE, hole, 1)
    if draw(st.integers(0, 3)) == 0:  # truncated somewhere
        frame = frame[: draw(st.integers(0, max(0, len(frame) - 1)))]
    return frame


@SETTINGS
@given(frames())
def test_every_message_type_with_any_fields_decodes_or_is_refused(frame):
    decoded_or_refused(frame)


@SETTINGS
@given(st.lists(frames(in_batch=True), min_size=1, max_size=5))
def test_batches_of_any_entries_decode_or_are_refused(entries):
    decoded_or_refused(p.join_batch(entries))


@pytest.mark.parametrize("tag", TYPES)
@pytest.mark.parametrize("depth", [101, 1000, 100_000])
def test_a_value_nested_past_the_limit_is_refused_as_too_deep_in_every_field(tag, depth):
    for name in ["v", "type", *fields_of(tag)]:
        body = {"v": p.PROTOCOL_VERSION, "type": tag, name: "\x00hole\x00"}
        for as_map in (False, True):
            frame = msgpack.packb(body).replace(HOLE, nested(depth, as_map=as_map))
            refused = decoded_or_refused(frame)
            assert isinstance(refused, p.ProtocolError) and refused.reason == "too_deep", name


def test_the_reported_frame_is_refused_not_raised():
    frame = b"\x82\xa1v" + b"\x91" * 1000 + b"\x01" + b"\xa4type\xa5hello"
    refused = decoded_or_refused(frame)
    assert isinstance(refused, p.ProtocolError) and refused.reason == "too_deep"
    assert refused.code == p.BAD_FRAME


def test_a_deep_batch_entry_is_refused_with_its_frame():
    entry = b"\x82\xa4type\xa6cancel\xaarequest_id" + nested(1000)
    refused = decoded_or_refused(p.join_batch([entry]))
    assert isinstance(refused, p.ProtocolError) and refused.reason == "too_deep"


def depth_of(value: object) -> int:
    """Containers nested in ``value`` (a scalar, or an empty container, holds none
    that a decoder descends into: 0)."""
    if isinstance(value, dict):
        value = [*value, *value.values()]
    if isinstance(value, list) and value:
        return 1 + max(map(depth_of, value))
    return 0


deep_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, min_size=1, max_size=3),
        st.dictionaries(st.text(max_size=3), inner, min_size=1, max_size=2),
    ),
    max_leaves=200,
)


@SETTINGS
@given(deep_values, st.integers(0, 150), st.lists(st.integers(0, 2**32), max_size=300))
def test_the_scan_finds_exactly_the_frames_nested_past_the_limit(value, wrap, padding):
    """Against the true depth of a value, however it is padded (long token lists take
    the walk rather than the cheap bound)."""
    frame = msgpack.packb([padding, value], use_bin_type=True)
    frame = b"\x91" * wrap + frame
    depth = wrap + depth_of([padding, value])
    expected = "too_deep" if depth > framescan.MAX_FRAME_DEPTH else None
    assert framescan.scan(frame) == expected


@pytest.mark.parametrize(
    "msg",
    [
        p.StepTokens(
            [f"w{i}" for i in range(300)], [[40_000 + i] for i in range(300)], ["x"] * 300
        ),
        p.Assign("a", [(i * 7919) % 49_152 for i in range(20_000)], p.SamplingParams(8)),
        p.Heartbeat(
            "w",
            3,
            [p.RequestRow(f"r{i}", 900, 0, 0, 4) for i in range(200)],
            [],
            1,
            9,
            p.CacheReport(True, 1, blocks=list(range(1 << 40, (1 << 40) + 300))),
        ),
        p.Submit("r", prompt="漢字" * 50_000),
    ],
    ids=lambda m: m.TYPE,
)
def test_large_frames_of_a_busy_cluster_pass_the_scan(msg):
    assert framescan.scan(p.encode(msg)) is None
    assert p.decode(p.encode(msg)) == msg


def test_the_worker_io_thread_refuses_a_deep_frame_and_registers_on():
    address = f"inproc://fuzz-link-{uuid.uuid4().hex}"
    router = RouterSocket(address)
    ready = p.Ready("w", "sim", "sim-w", "m.gguf", 4, 8192, 16, 100.0, [50.0], 0.05,
                    tiny_tokenizer())  # fmt: skip
    link = WorkerLink(address, ready, queue.Queue())
    stop = threading.Event()
    thread = start_link(link, stop)
    try:
        assert router.sock.poll(5000)
        identity, msg = router.recv()
        assert isinstance(msg, p.Ready)
        router.sock.send_multipart([identity, b"\x82\xa1v" + nested(1000) + b"\xa4type\xa5hello"])
        router.send(identity, p.Welcome())
        assert link.registered.wait(5)
        assert thread.is_alive() and link.refusals.counts == {"too_deep": 1}
    finally:
        stop.set()
        thread.join(5)
        router.close()
