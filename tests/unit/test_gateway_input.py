"""Every body the gateway can be sent gets a 2xx or an OpenAI-shaped 4xx (issue 28,
item 3): the named reproductions that were 500s with a traceback, and a property
test throwing arbitrary JSON-ish bodies at the parse layer and at the whole app.

The app is the real Starlette app, driven through ASGI; only the router is a fake,
one that encodes every Submit with the real protocol, as the client library would."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tandem.common import protocol as p
from tandem.gateway.errors import ApiError
from tandem.gateway.parse import read_request
from tests.gateway_fake import FakeRouter, call, gateway_app

MSGS = [{"role": "user", "content": "hi"}]
CHAT, TEXT = "/v1/chat/completions", "/v1/completions"


async def _app() -> Any:
    return await gateway_app(FakeRouter(workers=[{"model": "m.gguf"}]))


async def _post(app: Any, path: str, body: bytes) -> tuple[int, bytes]:
    return await call(app, "POST", path, body)


def post(path: str, body: bytes) -> tuple[int, bytes]:
    async def run() -> tuple[int, bytes]:
        return await _post(await _app(), path, body)

    return asyncio.run(run())


def assert_openai_error(status: int, raw: bytes) -> dict:
    assert 400 <= status < 500, (status, raw[:300])
    err = json.loads(raw)["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


def deep(n: int) -> bytes:
    return b'{"messages": ' + b"[" * n + b"]" * n + b"}"


# The reproductions: each was a 500 with a traceback.
REPRODUCTIONS = [
    (CHAT, json.dumps({"messages": [{"role": "user", "content": "a\udcff"}]}).encode(), None),
    (TEXT, json.dumps({"prompt": "\udcff"}).encode(), None),
    (TEXT, b'{"prompt": "ok", "model": "\\udcff"}', None),  # a 404 naming it, before
    (CHAT, deep(100_000), None),
    (TEXT, json.dumps({"prompt": [1, 2**64]}).encode(), "prompt"),
    (TEXT, json.dumps({"prompt": "hi", "max_tokens": 2**64}).encode(), "max_tokens"),
    (CHAT, json.dumps({"messages": MSGS, "max_completion_tokens": 2**64}).encode(),
     "max_completion_tokens"),
    (CHAT, json.dumps({"messages": MSGS, "seed": 2**64}).encode(), "seed"),
    (CHAT, json.dumps({"messages": MSGS, "seed": -1}).encode(), "seed"),
    (CHAT, json.dumps({"messages": MSGS, "top_k": 2**64}).encode(), "top_k"),
    (CHAT, json.dumps({"messages": MSGS, "stop": ["\ud800"]}).encode(), None),
    (CHAT, json.dumps({"messages": MSGS, "worker": "\udcff"}).encode(), None),
]  # fmt: skip


@pytest.mark.parametrize(("path", "body", "param"), REPRODUCTIONS)
def test_named_reproductions_are_400s(path, body, param):
    status, raw = post(path, body)
    err = assert_openai_error(status, raw)
    assert status == 400 and err["type"] == "invalid_request_error"
    if param is not None:
        assert err["param"] == param


def test_the_same_requests_made_valid_pass():
    assert post(TEXT, json.dumps({"prompt": [1, 2**31], "seed": 2**64 - 1}).encode())[0] == 200
    # A token id no vocabulary reaches is the protocol's refusal, named (not the router's).
    err = assert_openai_error(*post(TEXT, json.dumps({"prompt": [1, 2**63 - 1]}).encode()))
    assert err["param"] == "prompt" and "tokens[1]" in err["message"]
    assert post(CHAT, json.dumps({"messages": MSGS, "stop": ["\U0001f600"]}).encode())[0] == 200
    escaped = b'{"messages": [{"role": "user", "content": "\\ud83d\\ude00"}]}'  # a pair
    assert post(CHAT, escaped)[0] == 200
    assert post(CHAT, deep(50))[0] == 400  # nested, but not messages: the field's refusal


# ---------------------------------------------------------------- property tests
BIG = st.sampled_from([2**31, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63) - 1, 10**30])
ANY_CHAR = st.characters(min_codepoint=0, max_codepoint=0x10FFFF, exclude_categories=())
TEXTS = st.text(ANY_CHAR, max_size=8) | st.sampled_from(["user", "system", "text", "\udcff"])
SCALARS = st.none() | st.booleans() | st.integers() | BIG | st.floats() | TEXTS
VALUES = st.recursive(
    SCALARS, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(TEXTS, kids, max_size=4),
    max_leaves=12,
)  # fmt: skip
FIELDS = ["model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature",
          "top_p", "top_k", "seed", "stop", "stream", "stream_options", "n", "best_of", "echo",
          "ignore_eos", "worker", "tools", "logprobs", "suffix", "user"]  # fmt: skip
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "developer", "wizard"]) | VALUES},
    optional={"content": VALUES | st.lists(st.fixed_dictionaries({"type": st.just("text"),
                                                                   "text": VALUES}))},
)  # fmt: skip
# Bodies near valid ones (the messages or prompt right, each other field a plausible
# value or anything), bodies of random fields, and any JSON value at all.
PLAUSIBLE = st.integers(-2, 64) | st.floats(0, 2) | st.booleans() | st.none() | VALUES
NEAR_VALID = st.fixed_dictionaries(
    {"messages": st.just(MSGS) | st.lists(MESSAGE, max_size=3), "prompt": st.just("hi") | VALUES},
    optional={name: PLAUSIBLE for name in FIELDS if name not in ("messages", "prompt")},
)
BODIES = NEAR_VALID | st.dictionaries(st.sampled_from(FIELDS) | TEXTS, VALUES, max_size=8) | VALUES


def encode(body: Any, how: int) -> bytes:
    """JSON as clients write it: ASCII escapes, raw UTF-8 (lone surrogates then make
    invalid UTF-8), or cut short."""
    text = json.dumps(body, ensure_ascii=how == 0)
    raw = text.encode("utf-8", "surrogatepass")
    return raw[: len(raw) // 2] if how == 2 else raw


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=BODIES, how=st.sampled_from([0, 0, 1, 2]), chat=st.booleans())
def test_parse_layer_answers_a_generation_or_a_400(body, how, chat):
    raw = encode(body, how)
    try:
        gen = read_request(raw, chat, 16, "r")
    except ApiError as exc:
        assert exc.status == 400 and exc.body()["error"]["message"]
        json.dumps(exc.body()).encode()  # the error itself can be written
        return
    p.decode(p.encode(gen.submit))


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=BODIES, how=st.sampled_from([0, 1, 2]), chat=st.booleans())
def test_whole_app_answers_200_or_an_openai_4xx(body, how, chat):
    status, raw = post(CHAT if chat else TEXT, encode(body, how))
    if status != 200:
        assert_openai_error(status, raw)
