"""A body of many tiny chat messages is priced before it is parsed (issue 38, item 3).

At the gateway: 123k messages in 4 MiB get a 400 naming the count before the JSON
is read; a count hidden from the byte scan (keys spelled with escapes) is refused
once the JSON is read, before any message is; large bodies are parsed on threads,
a few at a time. At the router: a Submit with more messages than the wire allows
is refused from its array's header, whoever sent it, with its request id.
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest

from tandem.client.errors import BadRequest
from tandem.client.session import make_submit
from tandem.common import protocol as p
from tandem.common.validation import MAX_MESSAGES
from tandem.gateway import parse
from tandem.gateway.bodies import OFF_LOOP_BYTES, Parsers
from tests.gateway_fake import FakeRouter, call, gateway_app
from tests.helpers import Harness

CHAT = "/v1/chat/completions"
TINY = {"role": "user", "content": "a"}


def _post(body: bytes, **cfg: object) -> tuple[int, dict, FakeRouter]:
    router = FakeRouter()

    async def run() -> tuple[int, bytes]:
        return await call(await gateway_app(router, **cfg), "POST", CHAT, body)

    status, raw = asyncio.run(run())
    return status, json.loads(raw), router


def test_a_4_mib_body_of_123k_messages_is_refused_before_its_json_is_read(monkeypatch):
    body = json.dumps({"messages": [TINY] * 123_000}, separators=(",", ":")).encode()
    assert len(body) > 3 << 20

    def unread(raw: bytes) -> None:
        raise AssertionError("the body was parsed")

    monkeypatch.setattr(parse, "decode_json", unread)
    status, reply, router = _post(body)
    assert status == 400 and not router.submits
    err = reply["error"]
    assert err["param"] == "messages" and err["code"] is None
    assert err["message"] == (
        f'over {MAX_MESSAGES} chat messages ("role" 123000 times); '
        f"a request may hold at most {MAX_MESSAGES} chat messages"
    )


def test_escaped_keys_pass_the_byte_count_and_are_counted_once_read():
    msg = b'{"\\u0072ole":"user","content":"a"}'
    body = b'{"messages":[' + b",".join([msg] * (MAX_MESSAGES + 1)) + b"]}"
    status, reply, router = _post(body)
    assert status == 400 and not router.submits
    assert reply["error"]["message"].startswith(f"{MAX_MESSAGES + 1} chat messages")


@pytest.mark.parametrize("n, status", [(8, 200), (9, 400)])
def test_the_limit_is_the_gateways_max_messages(n, status):
    body = json.dumps({"messages": [TINY] * n}).encode()
    got, reply, router = _post(body, max_messages=8)
    assert got == status, reply
    assert len(router.submits) == (status == 200)


def test_a_role_value_is_not_a_message():
    # 10 messages whose contents are "role": 20 '"role"' strings, 10 keys.
    body = json.dumps({"messages": [{"role": "user", "content": "role"}] * 10}).encode()
    status, reply, _ = _post(body, max_messages=10)
    assert status == 200, reply


def test_a_large_body_is_parsed_off_the_loop(monkeypatch):
    threads: list[int] = []
    read = parse.read_request

    def watched(*args: object, **kw: object) -> object:
        threads.append(threading.get_ident())
        return read(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr("tandem.gateway.app.read_request", watched)
    big = {"role": "user", "content": "x" * OFF_LOOP_BYTES}
    for body in (json.dumps({"messages": [TINY]}), json.dumps({"messages": [big]})):
        status, reply, _ = _post(body.encode())
        assert status == 200, reply
    loop_thread = threading.get_ident()  # asyncio.run runs its loop on this thread
    assert threads[0] == loop_thread and threads[1] != loop_thread


def test_at_most_parsers_bodies_are_parsed_at_once():
    running, most, lock = [0], [0], threading.Lock()
    release = threading.Event()

    def slow(raw: bytes) -> int:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        release.wait(30)
        with lock:
            running[0] -= 1
        return len(raw)

    async def run() -> list[int]:
        parsers = Parsers(parsers=2, off_loop_bytes=10)
        tasks = [asyncio.ensure_future(parsers.parse(slow, b"x" * 100)) for _ in range(6)]
        while running[0] < 2:  # two started; the others wait for a slot
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)
        assert running[0] == 2
        release.set()
        return await asyncio.gather(*tasks)

    assert asyncio.run(run()) == [100] * 6
    assert most[0] == 2


def test_the_client_library_refuses_more_messages_than_the_router_takes():
    with pytest.raises(BadRequest, match=f"at most {MAX_MESSAGES}") as e:
        make_submit(messages=[TINY] * (MAX_MESSAGES + 1))
    assert e.value.field == "messages"
    make_submit(messages=[TINY] * MAX_MESSAGES)  # the bound itself is fine


def test_the_router_refuses_more_messages_at_its_socket(tmp_path: Path):
    h = Harness(tmp_path)
    try:
        for n, refused in ((MAX_MESSAGES + 1, True), (MAX_MESSAGES, False)):
            # Sent as an outside client would, past the library's own check.
            h.client.send(p.Submit(f"r{n}", messages=[TINY] * n))
            h.pump()
            reply = h.recv(h.client) if refused else None
            if refused:
                assert isinstance(reply, p.Error) and reply.request_id == f"r{n}"
                assert reply.code == p.BAD_REQUEST and "messages" in reply.message
                assert str(MAX_MESSAGES) in reply.message
            else:  # waits for a worker (none registered): no refusal
                assert not h.client.poll(200)
    finally:
        h.close()
