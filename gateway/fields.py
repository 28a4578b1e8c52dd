"""Every request field the gateway knows, and what it does with each: no silent ignoring.

A field of OpenAI's chat-completions or completions request is one of three kinds:

- **honoured**: tandem does what it asks (gateway/parse.py reads it);
- **ignored**: accepted and dropped, for the reason given: what it asks for does not
  change the answer (``user``, ``store``, a caching hint);
- **refused**: a value that asks for anything is a 400 naming the field; only the
  values that ask for nothing pass (null, false, an empty list, OpenAI's default).

A field in neither OpenAI's list nor tandem's extras is a 400 naming it: a typo of
``max_tokens`` must not pass for a request without one. docs/OPENAI.md shows this
table; tests/unit/test_gateway_fields.py checks it against the ``openai`` SDK's own
request types, so a field the SDK adds fails the test until it is classified here.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from tandem.gateway.errors import ApiError


class Kind(StrEnum):
    HONOURED = "honoured"
    IGNORED = "ignored"
    REFUSED = "refused"


@dataclass(frozen=True)
class Field:
    kind: Kind
    note: str  # honoured: how; ignored: why it changes nothing; refused: why (the 400 says it)
    harmless: tuple[Any, ...] = (None,)  # refused: the values that ask for nothing
    extra: bool = False  # tandem's own, not OpenAI's

    def refuses(self, value: Any) -> bool:
        return self.kind is Kind.REFUSED and value not in self.harmless


def _honoured(note: str, extra: bool = False) -> Field:
    return Field(Kind.HONOURED, note, extra=extra)


def _ignored(why: str) -> Field:
    return Field(Kind.IGNORED, why)


def _refused(why: str, *harmless: Any) -> Field:
    return Field(Kind.REFUSED, why, (None, *harmless))


_NO_STORE = "tandem stores no completions"
_USER_ID = "an end-user id for OpenAI's abuse monitoring; tandem keeps no per-user state"
_CACHE = "prefix caching is automatic (per worker) and routing follows it"
_NO_TOOLS = "tool calling is not supported"

# Fields both endpoints take, with the same meaning.
COMMON: dict[str, Field] = {
    "model": _honoured("the served model or one of its --model-alias names; another is a 404"),
    "max_tokens": _honoured("the decode budget (default: the gateway's --default-max-tokens)"),
    "temperature": _honoured("[0, 2]; OpenAI's default 1"),
    "top_p": _honoured("(0, 1]"),
    "seed": _honoured("the same seed on the same worker and engine gives the same text"),
    "stop": _honoured("a string or up to 16 strings; the text ends before the match"),
    "presence_penalty": _honoured("[-2, 2]; workers with the penalties capability"),
    "frequency_penalty": _honoured("[-2, 2]; workers with the penalties capability"),
    "logit_bias": _honoured("token id -> [-100, 100], <= 300 entries; logit_bias capability"),
    "n": _honoured("1 only: tandem returns one choice per request; n > 1 is a 400"),
    "stream": _honoured("server-sent events, as OpenAI's"),
    "stream_options": _honoured("include_usage: a last chunk with the usage"),
    "user": _ignored(_USER_ID),
}
CHAT: dict[str, Field] = {
    **COMMON,
    "messages": _honoured("rendered with the model's chat template; text content parts only"),
    "max_completion_tokens": _honoured("as max_tokens (wins over it)"),
    "logprobs": _honoured("true: each output token's logprob; logprobs capability"),
    "top_logprobs": _honoured("0..20 alternatives per token (needs logprobs: true)"),
    "response_format": _honoured(
        "text, json_object, json_schema: output constrained to the schema; "
        "json_schema capability (llama.cpp workers)"
    ),
    "metadata": _ignored(_NO_STORE),
    "store": _ignored(_NO_STORE),
    "safety_identifier": _ignored(_USER_ID),
    "service_tier": _ignored("one tier: every request is served alike"),
    "prompt_cache_key": _ignored(_CACHE),
    "prompt_cache_options": _ignored(_CACHE),
    "prompt_cache_retention": _ignored(_CACHE),
    "prediction": _ignored("a latency hint: the output is the same without it"),
    "parallel_tool_calls": _ignored("only means something with tools, which are refused"),
    "tools": _refused(_NO_TOOLS, []),
    "tool_choice": _refused(_NO_TOOLS, "none"),
    "functions": _refused(_NO_TOOLS, []),
    "function_call": _refused(_NO_TOOLS, "none"),
    "audio": _refused("audio output is not supported"),
    "modalities": _refused("text output only", ["text"]),
    "web_search_options": _refused("web search is not supported"),
    "reasoning_effort": _refused("tandem does not steer a model's reasoning"),
    "verbosity": _refused("tandem does not steer a model's verbosity", "medium"),
    "moderation": _refused("tandem runs no moderation"),
}
COMPLETION: dict[str, Field] = {
    **COMMON,
    "prompt": _honoured("one prompt: a string or token ids (a list of one of those)"),
    "logprobs": _honoured("0..20: the chosen token's logprob and the top n; logprobs capability"),
    "best_of": _honoured("1 only; more is a 400"),
    "echo": _refused("echoing the prompt is not supported", False),
    "suffix": _refused("suffix (fill-in-the-middle) is not supported", ""),
}
# tandem's own fields, on both endpoints (vLLM and llama.cpp's server take the first four).
EXTRAS: dict[str, Field] = {
    "top_k": _honoured("keep the k likeliest tokens (0: all)", extra=True),
    "min_p": _honoured("[0, 1]: drop tokens below min_p x the top one's; min_p capability", True),
    "repetition_penalty": _honoured("(0, 10], llama.cpp/HF semantics; penalties capability", True),
    "ignore_eos": _honoured("generate through end-of-generation tokens", extra=True),
    "min_tokens": _honoured("no end-of-generation token before this many tokens", extra=True),
    "worker": _honoured("pin the request to a worker id or device label", extra=True),
}


def fields(chat: bool) -> dict[str, Field]:
    """Every field one endpoint knows."""
    return {**(CHAT if chat else COMPLETION), **EXTRAS}


def check_fields(body: dict[str, Any], chat: bool) -> None:
    """A 400 naming the first field of ``body`` that is unknown, or refused with a
    value that asks for something."""
    known = fields(chat)
    for name, value in body.items():
        f = known.get(name)
        if f is None:
            where = "chat completions" if chat else "completions"
            shown = name.encode("utf-8", "backslashreplace").decode()  # a lone surrogate, too
            raise ApiError.bad(
                f"unknown field {shown!r}: not an OpenAI {where} field nor a tandem extra "
                "(docs/OPENAI.md lists them)",
                shown,
            )
        if f.refuses(value):
            raise ApiError.bad(f"{name}: {f.note}", name)
