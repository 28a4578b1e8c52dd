"""No silent ignoring: every field of OpenAI's chat-completions and completions requests,
read from the installed ``openai`` SDK's request types, is classified (gateway/fields.py)
and behaves as its class says through the whole gateway app:

- honoured: the request it makes (the Submit the router gets, or the answer) differs
  from the same request without the field;
- ignored: 200, and the same Submit and answer as without it;
- refused: a 400 naming the field; its harmless values pass as if absent.
"""

from __future__ import annotations

import asyncio
import json
import re
import typing
from pathlib import Path
from typing import Any

import pytest
from openai.types import completion_create_params as text_params
from openai.types.chat import completion_create_params as chat_params

from tandem.gateway.fields import CHAT, COMPLETION, EXTRAS, Kind, fields
from tests.gateway_fake import FakeRouter, call, gateway_app, sse_events

MSGS = [{"role": "user", "content": "hi"}]
PATHS = {True: "/v1/chat/completions", False: "/v1/completions"}
BASE = {True: {"messages": MSGS}, False: {"prompt": "hi"}}
DOC = Path(__file__).parents[2] / "docs" / "OPENAI.md"

# A value of each field that asks for something, merged into the base request (a
# dict: several fields, the one under test among them; the rest stay in the baseline).
EXAMPLES: dict[str, Any] = {
    "model": "alias",
    "messages": [{"role": "user", "content": "hello"}],
    "prompt": "hello",
    "max_tokens": 7,
    "max_completion_tokens": 7,
    "temperature": 0.5,
    "top_p": 0.5,
    "seed": 3,
    "stop": "x",
    "presence_penalty": 0.5,
    "frequency_penalty": 0.5,
    "logit_bias": {"5": 10},
    "n": 1,
    "best_of": 1,
    "stream": True,
    "stream_options": {"stream": True, "stream_options": {"include_usage": True}},
    "logprobs": 2,  # completions; chat's is below
    "top_logprobs": {"logprobs": True, "top_logprobs": 3},
    "response_format": {"type": "json_object"},
    "top_k": 5,
    "min_p": 0.1,
    "repetition_penalty": 1.2,
    "ignore_eos": True,
    "min_tokens": 3,
    "worker": "w0",
    # ignored
    "user": "u1",
    "metadata": {"k": "v"},
    "store": True,
    "safety_identifier": "s1",
    "service_tier": "priority",
    "prompt_cache_key": "k",
    "prompt_cache_options": {"ttl": "24h"},
    "prompt_cache_retention": "24h",
    "prediction": {"type": "content", "content": "hi"},
    "parallel_tool_calls": True,
    # refused
    "tools": [{"type": "function", "function": {"name": "f"}}],
    "tool_choice": "auto",
    "functions": [{"name": "f"}],
    "function_call": "auto",
    "audio": {"voice": "alloy", "format": "wav"},
    "modalities": ["text", "audio"],
    "web_search_options": {},
    "reasoning_effort": "low",
    "verbosity": "low",
    "moderation": {"model": "omni-moderation-latest"},
    "echo": True,
    "suffix": "x",
}
CHAT_EXAMPLES = {**EXAMPLES, "logprobs": True}
# Honoured fields whose honoured values are only their defaults: another value is a 400.
LIMITED = {"n": 2, "best_of": 2}


def sdk_fields(module: Any) -> set[str]:
    """Every body field of one endpoint, as the SDK types them (streaming or not)."""
    names: set[str] = set()
    for cls in ("CompletionCreateParamsBase", "CompletionCreateParamsStreaming",
                "CompletionCreateParamsNonStreaming"):  # fmt: skip
        names |= set(typing.get_type_hints(getattr(module, cls)))
    return names


CASES = [(True, n) for n in sorted(sdk_fields(chat_params) | set(EXTRAS))] + [
    (False, n) for n in sorted(sdk_fields(text_params) | set(EXTRAS))
]


def test_every_sdk_field_is_classified():
    assert sdk_fields(chat_params) - set(CHAT) == set()
    assert sdk_fields(text_params) - set(COMPLETION) == set()


def effect(chat: bool, body: dict[str, Any]) -> tuple[int, Any, Any]:
    """(status, the Submit the router got, the answer without its ids and times)."""

    async def run() -> tuple[int, bytes, list]:
        router = FakeRouter(workers=[{"model": "m.gguf", "n_ctx": 4096}])
        app = await gateway_app(router, model_aliases=("alias",))
        status, raw = await call(app, "POST", PATHS[chat], body)
        return status, raw, router.submits

    status, raw, submits = asyncio.run(run())
    if status != 200:
        return status, None, json.loads(raw)["error"]["param"]
    answer = sse_events(raw) if raw.startswith(b"data: ") else [json.loads(raw)]
    for a in answer:
        for k in ("id", "created"):
            a.pop(k, None)
    (sub,) = submits
    sub.request_id = ""
    return status, sub, answer


@pytest.mark.parametrize(("chat", "name"), CASES)
def test_each_field_does_what_its_class_says(chat: bool, name: str):
    f = fields(chat)[name]
    example = (CHAT_EXAMPLES if chat else EXAMPLES)[name]
    given = example if isinstance(example, dict) and name in example else {name: example}
    body = {**BASE[chat], **given}
    without = {k: v for k, v in body.items() if k != name}
    if name in BASE[chat]:  # a required field: compared with another value of it
        without[name] = BASE[chat][name]
    got, baseline = effect(chat, body), effect(chat, without)
    assert baseline[0] == 200
    if f.kind is Kind.HONOURED and name in LIMITED:
        assert got == baseline  # its default is what tandem does
        assert effect(chat, {**body, name: LIMITED[name]})[::2] == (400, name)
    elif f.kind is Kind.HONOURED:
        assert got[0] == 200 and got != baseline
    elif f.kind is Kind.IGNORED:
        assert got == baseline
    else:
        assert got[::2] == (400, name)
        for harmless in f.harmless:
            assert effect(chat, {**without, name: harmless}) == baseline, harmless


@pytest.mark.parametrize("chat", [True, False])
def test_an_unknown_field_is_a_400_naming_it(chat: bool):
    assert effect(chat, {**BASE[chat], "max_tokenz": 5})[::2] == (400, "max_tokenz")


def test_the_docs_table_is_the_code_table():
    rows = re.findall(r"^\| `(\w+)` \| (honoured|ignored|refused) \|", DOC.read_text(), re.M)
    documented = {(name, kind) for name, kind in rows}
    code = {(n, str(f.kind)) for table in (CHAT, COMPLETION, EXTRAS) for n, f in table.items()}
    assert documented == code
