"""The client library refuses what the wire cannot carry (issue 28, item 6): values
msgpack cannot encode become BadRequest naming their field, raised before anything
is sent, by the sync and the async client alike."""

from __future__ import annotations

import asyncio

import msgpack
import pytest
import zmq

from tandem.client import AsyncClient, BadRequest, Client
from tandem.client.session import make_submit
from tandem.common import protocol as p
from tandem.launcher.cluster import free_tcp_address

CASES = [
    ({"prompt": "hi", "max_tokens": 2**64}, "max_tokens"),
    ({"prompt": "\udcff"}, "prompt"),
    ({"tokens": [1, 2, 2**64]}, "tokens[2]"),
    ({"tokens": [1, -1]}, "tokens[1]"),
    ({"prompt": "hi", "seed": 2**64}, "seed"),
    ({"prompt": "hi", "top_k": 2**63}, "top_k"),
    ({"messages": [{"role": "user", "content": "a\ud800"}]}, "messages[0].content"),
    ({"prompt": "hi", "stop": ["ok", "\udfff"]}, "stop[1]"),
    ({"prompt": "hi", "worker": "gpu\udcff"}, "worker"),
    ({"prompt": "hi", "max_tokens": "12"}, "max_tokens"),
    ({"prompt": "hi", "temperature": float("nan")}, "temperature"),
    ({"prompt": "hi", "ignore_eos": 1}, "ignore_eos"),
    ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ({"prompt": 5}, "prompt"),
]


@pytest.fixture
def listener():
    """A bound socket where a client would send: it must receive nothing."""
    address = free_tcp_address()
    sock = zmq.Context.instance().socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(address)
    yield address, sock
    sock.close()


@pytest.mark.parametrize(("kwargs", "field"), CASES)
def test_sync_client_refuses_before_sending(listener, kwargs, field):
    address, sock = listener
    with Client(address, timeout_s=60, connect_timeout_s=60) as c, pytest.raises(BadRequest) as e:
        c.generate(**kwargs)
    assert e.value.field == field and field.split("[")[0] in e.value.message
    assert not sock.poll(100)  # nothing went out


@pytest.mark.parametrize(("kwargs", "field"), CASES)
def test_async_client_refuses_before_sending(listener, kwargs, field):
    address, sock = listener

    async def run() -> None:
        async with AsyncClient(address, timeout_s=60) as c:
            with pytest.raises(BadRequest) as e:
                await asyncio.wait_for(c.generate(**kwargs), 30)
            assert e.value.field == field
            with pytest.raises(BadRequest):
                async for _ in c.stream(**kwargs):
                    pass

    asyncio.run(run())
    assert not sock.poll(100)


def test_async_client_sends_a_prebuilt_submit_as_it_is(listener):
    """``submit=``: a Submit built (and checked) once by make_submit goes out unchanged,
    as the gateway sends each HTTP request's; given with a prompt or fields, a TypeError
    before anything is sent."""
    address, sock = listener
    sub = make_submit("hi", request_id="r-1", stream=False, max_tokens=3, seed=7)

    async def run() -> None:
        async with AsyncClient(address, timeout_s=60) as c:
            with pytest.raises(TypeError, match="submit= alone"):
                await c.generate("hi", submit=sub)
            assert not sock.poll(100)
            task = asyncio.ensure_future(c.generate(submit=sub))
            frames = await asyncio.to_thread(sock.recv_multipart)  # identity, frame
            task.cancel()
            assert p.decode(frames[-1]) == sub

    asyncio.run(run())


def test_values_the_wire_carries_pass():
    sub = make_submit(tokens=[0, 2**31], seed=2**64 - 1, top_k=2**31, stop="x")
    assert sub.sampling.stop == ["x"]  # one stop string, not its characters
    make_submit(messages=[{"role": "user", "content": "\U0001f600 emoji é"}])


# ---------------------------------------------------------------- typed sampling fields
def test_a_misspelt_sampling_argument_is_a_type_error_naming_it():
    with pytest.raises(TypeError, match="'temprature'.*'temperature'"):
        make_submit("hi", temprature=0.5)
    with pytest.raises(TypeError, match="'warp'"):
        make_submit("hi", warp=1)


@pytest.mark.parametrize("name", sorted(p.SamplingParams.__struct_fields__))
def test_every_sampling_field_refuses_a_wrong_type_naming_its_path(name):
    """A map is of no sampling field's type (logit_bias: not with text keys)."""
    with pytest.raises(BadRequest) as e:
        make_submit("hi", **{name: {"x": "y"}})
    assert e.value.field == name and f"sampling.{name}" in e.value.message


def test_the_wire_refuses_unknown_fields_of_a_message_and_of_its_sampling():
    for body, where in (
        ({"type": "cancel", "request_id": "r", "colour": 1}, "cancel: unknown field 'colour'"),
        ({"type": "submit", "request_id": "r", "sampling": {"temprature": 1}},
         "submit.sampling: unknown field 'temprature'"),
    ):  # fmt: skip
        with pytest.raises(p.ProtocolError) as e:
            p.decode(msgpack.packb({"v": p.PROTOCOL_VERSION, **body}))
        assert e.value.message == where and e.value.code == p.BAD_REQUEST


@pytest.mark.parametrize("value", [-1, 0, 2**24 + 1, 2**64])
def test_a_max_tokens_out_of_range_is_told_the_range_it_has(value):
    """Issue 38, item 6: -1 was told "expected int >= 0" (0 is refused too) and 2**64
    the 64-bit ends of any integer."""
    with pytest.raises(BadRequest, match=r"^max_tokens must be in 1\.\.16777216, got ") as e:
        make_submit("hi", max_tokens=value)
    assert e.value.field == "max_tokens"
    prefill = make_submit("hi", max_tokens=0, prefill_only=True)  # its own range: 0..
    assert prefill.sampling.max_tokens == 0
