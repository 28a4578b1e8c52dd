"""The gateway without processes: OpenAI bodies -> Submit options, results -> OpenAI
shapes, tandem error codes -> HTTP statuses, body limits, shared status queries."""

from __future__ import annotations

import asyncio
import json

import pytest
from starlette.requests import Request

from tandem.client.errors import NoWorkers, Overloaded, PromptTooLong, RequestTimeout, TandemError
from tandem.client.session import Result
from tandem.common import protocol as p
from tandem.gateway.app import Gateway
from tandem.gateway.config import GatewayConfig
from tandem.gateway.errors import ApiError
from tandem.gateway.parse import parse_chat, parse_completion
from tandem.gateway.render import DONE_EVENT, Reply

USER = [{"role": "user", "content": "hi"}]


def test_chat_maps_openai_fields_onto_submit_options():
    g = parse_chat(
        {
            "model": "m",
            "messages": [
                {"role": "developer", "content": "be brief"},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
                {"role": "assistant", "content": None},
            ],
            "max_tokens": 9,
            "max_completion_tokens": 7,  # the newer name wins
            "temperature": 0,
            "top_p": 0.5,
            "seed": 3,
            "stop": "x",
            "stream": True,
            "stream_options": {"include_usage": True},
            "user": "ignored",
            "top_k": 4,
            "ignore_eos": True,
            "worker": "gpu",
        },
        default_max_tokens=100,
    )
    assert g.model == "m" and g.stream and g.include_usage
    assert g.messages == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "ab"},
        {"role": "assistant", "content": ""},
    ]
    s = g.sampling
    assert (s.max_tokens, s.temperature, s.top_p, s.seed) == (7, 0.0, 0.5, 3)
    assert (s.stop, s.top_k, s.ignore_eos, g.worker) == (["x"], 4, True, "gpu")


def test_defaults_follow_openai_not_tandem():
    g = parse_chat({"messages": USER}, default_max_tokens=100)
    assert g.sampling.temperature == 1.0 and g.sampling.max_tokens == 100
    assert g.model is None and not g.stream and not g.include_usage


def test_completion_prompt_forms():
    assert parse_completion({"prompt": "abc"}, 5).prompt == "abc"
    assert parse_completion({"prompt": ["abc"]}, 5).prompt == "abc"
    assert parse_completion({"prompt": [1, 2]}, 5).tokens == [1, 2]
    assert parse_completion({"prompt": [[1, 2]]}, 5).tokens == [1, 2]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": USER, "n": 2}, "n"),
        ({"messages": USER, "temperature": 2.5}, "temperature"),
        ({"messages": USER, "top_p": 0}, "top_p"),
        ({"messages": USER, "max_tokens": 0}, "max_tokens"),
        ({"messages": USER, "max_tokens": True}, "max_tokens"),
        ({"messages": USER, "stop": [1]}, "stop"),
        ({"messages": USER, "stream": "yes"}, "stream"),
        ({"messages": USER, "tools": [{"type": "function"}]}, "tools"),
        ({"messages": USER, "top_logprobs": 2}, "top_logprobs"),  # without logprobs
        ({"messages": USER, "frobnicate": 1}, "frobnicate"),  # unknown: never dropped
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0]"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages[0].content",
        ),
        ({"messages": USER, "model": 5}, "model"),
    ],
)
def test_chat_refusals_name_their_field(body, param):
    with pytest.raises(ApiError) as e:
        parse_chat(body, 16)
    assert e.value.status == 400 and e.value.param == param
    assert e.value.body()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("prompt", [None, "", [], ["a", "b"], [1, "a"], [[1], [2]]])
def test_completion_refuses_anything_but_one_prompt(prompt):
    with pytest.raises(ApiError) as e:
        parse_completion({"prompt": prompt}, 16)
    assert e.value.param == "prompt"


def test_body_must_be_an_object():
    with pytest.raises(ApiError):
        parse_chat([1, 2], 16)


@pytest.mark.parametrize(
    ("exc", "status", "code"),
    [
        (PromptTooLong("long"), 400, "context_length_exceeded"),
        (Overloaded("full"), 429, "overloaded"),
        (NoWorkers("none"), 503, "no_workers"),
        (TandemError("bug", code="internal"), 500, "internal"),
    ],
)
def test_tandem_errors_map_to_http_statuses(exc, status, code):
    err = ApiError.from_tandem(exc)
    assert (err.status, err.code) == (status, code)


def test_replies_have_openai_shapes():
    stats = {"prompt_tokens": 5, "output_tokens": 3, "cached_tokens": 4, "ttft_s": 0.1}
    result = Result("r1", "abc", [1, 2, 3], "eos", stats, "cpu0")
    chat = Reply(True, "r1", "m").complete(result)
    assert chat["id"] == "chatcmpl-r1" and chat["object"] == "chat.completion"
    assert chat["choices"][0]["message"] == {"role": "assistant", "content": "abc"}
    assert chat["choices"][0]["finish_reason"] == "stop"  # eos reads as stop
    assert chat["usage"] == {
        "prompt_tokens": 5,
        "completion_tokens": 3,
        "total_tokens": 8,
        "prompt_tokens_details": {"cached_tokens": 4},
    }
    text = Reply(False, "r1", "m").complete(result)
    assert text["object"] == "text_completion" and text["choices"][0]["text"] == "abc"


def test_stream_chunks_are_sse_events():
    reply = Reply(True, "r1", "m")
    for raw in (reply.chunk("a", role=True), reply.text_chunk('q"\n'), reply.chunk(None, "length")):
        assert raw.startswith(b"data: ") and raw.endswith(b"\n\n")
        json.loads(raw[6:])
    assert json.loads(reply.text_chunk('q"\n')[6:]) == json.loads(reply.chunk('q"\n')[6:])
    last = json.loads(reply.chunk(None, "length")[6:])
    assert last["choices"][0] == {
        "index": 0,
        "delta": {},
        "logprobs": None,
        "finish_reason": "length",
    }
    assert DONE_EVENT == b"data: [DONE]\n\n"


@pytest.mark.parametrize(
    "kwargs",
    [{"port": 70000}, {"api_key": ""}, {"max_concurrent": 0}, {"request_timeout_s": 0}],
)
def test_config_is_validated(kwargs):
    with pytest.raises(ValueError):
        GatewayConfig("tcp://127.0.0.1:5555", **kwargs)
    with pytest.raises(ValueError):
        GatewayConfig("127.0.0.1:5555")


@pytest.mark.parametrize("declared", [True, False])
def test_bodies_over_the_limit_are_a_413(declared):
    gw = Gateway(GatewayConfig("tcp://127.0.0.1:5555", max_body_bytes=1024))
    pieces = [b"x" * 600, b"x" * 600]
    headers = [(b"content-length", b"1200")] if declared else []

    async def receive():
        return {"type": "http.request", "body": pieces.pop(0), "more_body": bool(pieces)}

    request = Request({"type": "http", "method": "POST", "headers": headers}, receive)
    with pytest.raises(ApiError) as e:
        asyncio.run(gw.body(request))
    assert e.value.status == 413 and e.value.code == "body_too_large"


class SlowStatus:
    """A stand-in for the gateway's status client: counts queries, fails or answers."""

    def __init__(self, fail: bool) -> None:
        self.fail, self.calls = fail, 0

    async def status(self) -> p.StatusReply:
        self.calls += 1
        await asyncio.sleep(0.01)
        if self.fail:
            raise RequestTimeout("no reply for 3.0s")
        return p.StatusReply("phase_cost", [{"model": "m.gguf"}])

    async def close(self) -> None:
        pass


@pytest.mark.parametrize("fail", [True, False])
def test_a_burst_shares_one_status_query(fail):
    gw = Gateway(GatewayConfig("tcp://127.0.0.1:5555"))

    async def burst() -> list:
        await gw.start()
        await gw.status_client.close()  # type: ignore[union-attr]
        gw.status_client = SlowStatus(fail)  # type: ignore[assignment]
        try:
            return await asyncio.gather(
                *(gw.served_model(None) for _ in range(5)), return_exceptions=True
            )
        finally:
            await gw.stop()

    out = asyncio.run(burst())
    assert gw.status_client.calls == 1
    if fail:
        assert all(isinstance(x, ApiError) and x.status == 503 for x in out)
    else:
        assert out == ["m"] * 5  # the display name of the worker's m.gguf
