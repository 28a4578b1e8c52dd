"""OpenAI's penalties, logit_bias, min_p, response_format and logprobs -> SamplingParams
fields (gateway/sampling.py), and the logprobs they answer with in OpenAI's shapes."""

from __future__ import annotations

import asyncio
import json

import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.completion_choice import Logprobs

from tandem.client.session import Delta, Result
from tandem.common import protocol as p
from tandem.gateway.errors import ApiError
from tandem.gateway.sampling import JSON_OBJECT_SCHEMA, sampling_options
from tests.gateway_fake import FakeRouter, call, gateway_app, sse_events

MSGS = [{"role": "user", "content": "hi"}]
PATHS = {True: "/v1/chat/completions", False: "/v1/completions"}

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def test_absent_fields_ask_for_nothing():
    assert sampling_options({}, chat=True) == {}
    assert sampling_options({"response_format": {"type": "text"}}, chat=True) == {}


def test_fields_map_onto_sampling_params():
    body = {
        "presence_penalty": 1,
        "frequency_penalty": -0.5,
        "repetition_penalty": 1.1,
        "min_p": 0.05,
        "logit_bias": {"15": -100, "7": 2.5},
        "logprobs": True,
        "top_logprobs": 4,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}},
    }
    got = sampling_options(body, chat=True)
    assert got == {
        "presence_penalty": 1.0,
        "frequency_penalty": -0.5,
        "repetition_penalty": 1.1,
        "min_p": 0.05,
        "logit_bias": {15: -100.0, 7: 2.5},
        "logprobs": 4,
        "json_schema": json.dumps(SCHEMA, separators=(",", ":")),
    }
    assert json.loads(got["json_schema"]) == SCHEMA
    assert sampling_options({"logprobs": True}, chat=True) == {"logprobs": 0}
    assert sampling_options({"logprobs": False}, chat=True) == {}
    assert sampling_options({"logprobs": 3}, chat=False) == {"logprobs": 3}
    json_object = {"response_format": {"type": "json_object"}}
    assert sampling_options(json_object, chat=True) == {"json_schema": JSON_OBJECT_SCHEMA}


@pytest.mark.parametrize(
    ("body", "chat", "param"),
    [
        ({"presence_penalty": "1"}, True, "presence_penalty"),
        ({"min_p": True}, True, "min_p"),
        ({"logit_bias": [1, 2]}, True, "logit_bias"),
        ({"logit_bias": {"tok": 1}}, True, "logit_bias"),
        ({"logit_bias": {"-5": 1}}, True, "logit_bias"),
        ({"logit_bias": {"5": "x"}}, False, "logit_bias"),
        ({"logit_bias": {"99999999999": 1}}, True, "logit_bias"),
        ({"logit_bias": {"9" * 5000: 1}}, True, "logit_bias"),
        ({"logprobs": 2}, True, "logprobs"),  # chat's is a boolean
        ({"logprobs": True}, False, "logprobs"),  # completions' is a number
        ({"top_logprobs": 2}, True, "top_logprobs"),  # without logprobs: true
        ({"logprobs": True, "top_logprobs": 1.5}, True, "top_logprobs"),
        ({"response_format": {"type": "xml"}}, True, "response_format"),
        ({"response_format": "json"}, True, "response_format"),
        ({"response_format": {"type": "json_schema"}}, True, "response_format"),
        ({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}}, True,
         "response_format"),  # no name
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": 3}}},
         True, "response_format"),
    ],
)  # fmt: skip
def test_wrong_types_are_400s_naming_the_openai_field(body, chat, param):
    with pytest.raises(ApiError) as err:
        sampling_options(body, chat)
    assert err.value.status == 400 and err.value.param == param


# ------------------------------------------------------------ logprobs in the answers
def lp(tid: int, piece: str, logprob: float, *top: tuple[int, str, float]) -> p.TokenLogprob:
    return p.TokenLogprob(tid, piece, logprob, list(top))


A = lp(1, "He", -0.25, (1, "He", -0.25), (2, "I", -1.5))
B = lp(3, "llo", float("-inf"), (4, "y", -0.5), (3, "llo", float("-inf")))
C = lp(5, "é", -0.5, (5, "é", -0.5), (6, "!", -2.0))
DELTAS = [Delta([1], "He", [A]), Delta([3], "", [B]), Delta([5], "lloé", [C])]


def answer(chat: bool, stream: bool) -> list[dict]:
    """The gateway's answer (its SSE chunks, or the one response) to a request for
    logprobs whose worker sent DELTAS."""
    result = Result("r", "Helloé", [1, 3, 5], p.FinishReason.LENGTH, {}, "w0", [A, B, C])
    router = FakeRouter(deltas=DELTAS, result=result)
    body = {**({"messages": MSGS, "logprobs": True, "top_logprobs": 2} if chat else
               {"prompt": "x", "logprobs": 2}), "stream": stream}  # fmt: skip

    async def run() -> tuple[int, bytes]:
        return await call(await gateway_app(router), "POST", PATHS[chat], body)

    status, raw = asyncio.run(run())
    assert status == 200, raw
    assert router.submits[0].sampling.logprobs == 2
    return sse_events(raw) if stream else [json.loads(raw)]


def test_chat_logprobs_are_openais_shape_whole_and_streamed():
    (whole,) = answer(chat=True, stream=False)
    parsed = ChatCompletion.model_validate(whole)  # the official SDK reads it
    content = parsed.choices[0].logprobs.content
    assert [(t.token, t.logprob) for t in content] == [("He", -0.25), ("llo", -9999.0), ("é", -0.5)]
    assert content[2].bytes == list("é".encode()) and content[2].top_logprobs[1].token == "!"
    assert [t.token for t in content[1].top_logprobs] == ["y", "llo"]
    chunks = [ChatCompletionChunk.model_validate(c) for c in answer(chat=True, stream=True)]
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs for t in
                c.choices[0].logprobs.content]  # fmt: skip
    assert streamed == content  # the token whose text is held back still brings its logprob
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Helloé"


def test_completion_logprobs_are_openais_legacy_shape_whole_and_streamed():
    (whole,) = answer(chat=False, stream=False)
    logprobs = Completion.model_validate(whole).choices[0].logprobs
    assert logprobs.tokens == ["He", "llo", "é"]
    assert logprobs.token_logprobs == [-0.25, -9999.0, -0.5]
    assert logprobs.top_logprobs == [{"He": -0.25, "I": -1.5}, {"y": -0.5, "llo": -9999.0},
                                     {"é": -0.5, "!": -2.0}]  # fmt: skip
    assert logprobs.text_offset == [0, 2, 5]
    chunks = answer(chat=False, stream=True)  # (the SDK builds stream chunks unvalidated)
    parts = [Logprobs.model_validate(c["choices"][0]["logprobs"]) for c in chunks
             if c["choices"] and c["choices"][0]["logprobs"]]  # fmt: skip
    assert [t for x in parts for t in x.tokens] == logprobs.tokens
    assert [o for x in parts for o in x.text_offset] == logprobs.text_offset  # one count


def test_no_logprobs_asked_none_answered():
    router = FakeRouter(deltas=[Delta([1], "a")])

    async def run() -> tuple[int, bytes]:
        return await call(await gateway_app(router), "POST", PATHS[True],
                          {"messages": MSGS, "stream": True})  # fmt: skip

    _, raw = asyncio.run(run())
    assert all(c["choices"][0]["logprobs"] is None for c in sse_events(raw) if c["choices"])
