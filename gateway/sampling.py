"""OpenAI's sampling fields beyond the basics -> SamplingParams fields.

Penalties, ``logit_bias``, ``min_p``, ``response_format`` and logprobs, read from a
request body and checked for type here (a 400 naming the OpenAI field); their ranges
are SamplingParams' own rules (``SamplingParams.problem``), which the client library
applies before a Submit leaves and the router at its door, so they live in one place.
Which workers can serve them is the router's business (broker/capabilities.py).
"""

from __future__ import annotations

import json
from typing import Any

from tandem.common.validation import MAX_TOKEN_ID
from tandem.gateway.errors import ApiError

# json_object asks for any JSON object: the schema every worker's grammar gets for it.
JSON_OBJECT_SCHEMA = '{"type": "object"}'
# The SamplingParams field a refusal names -> the OpenAI field to name in the 400.
OPENAI_PARAM = {"json_schema": "response_format"}
NUMBERS = ("presence_penalty", "frequency_penalty", "repetition_penalty", "min_p")


def sampling_options(body: dict[str, Any], chat: bool) -> dict[str, Any]:
    """The SamplingParams fields these OpenAI fields of ``body`` ask for (none that
    are absent or neutral-by-absence: the defaults stay SamplingParams')."""
    out: dict[str, Any] = {name: _number(body, name) for name in NUMBERS}
    out["logit_bias"] = logit_bias(body.get("logit_bias"))
    out["logprobs"] = chat_logprobs(body) if chat else completion_logprobs(body)
    out["json_schema"] = response_format(body.get("response_format")) if chat else None
    return {k: v for k, v in out.items() if v is not None}


def _number(body: dict[str, Any], name: str) -> float | None:
    x = body.get(name)
    if x is None:
        return None
    if isinstance(x, bool) or not isinstance(x, int | float):
        raise ApiError.bad(f"{name} must be a number", name)
    return float(x)


def logit_bias(raw: Any) -> dict[int, float] | None:
    """OpenAI's ``{"token id": bias}`` (JSON object keys are strings) as ``{id: bias}``."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ApiError.bad("logit_bias must be an object of token id -> bias", "logit_bias")
    out = {}
    for key, bias in raw.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit()) or len(key) > 10:
            raise ApiError.bad(f"logit_bias keys must be token ids, not {key!r}", "logit_bias")
        if int(key) > MAX_TOKEN_ID:
            raise ApiError.bad(f"logit_bias: no token has id {key}", "logit_bias")
        if isinstance(bias, bool) or not isinstance(bias, int | float):
            raise ApiError.bad(f"logit_bias[{key!r}] must be a number", "logit_bias")
        out[int(key)] = float(bias)
    return out


def chat_logprobs(body: dict[str, Any]) -> int | None:
    """Chat's ``logprobs: true`` (+ ``top_logprobs: n``) as SamplingParams.logprobs."""
    want, top = body.get("logprobs"), body.get("top_logprobs")
    if want is not None and not isinstance(want, bool):
        raise ApiError.bad("logprobs must be true or false", "logprobs")
    if top is not None and (isinstance(top, bool) or not isinstance(top, int)):
        raise ApiError.bad("top_logprobs must be an integer", "top_logprobs")
    if top is not None and not want:
        raise ApiError.bad("top_logprobs needs logprobs: true", "top_logprobs")
    return (top or 0) if want else None


def completion_logprobs(body: dict[str, Any]) -> int | None:
    """Completions' ``logprobs: n``: the chosen token's and the n likeliest."""
    n = body.get("logprobs")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int)):
        raise ApiError.bad("logprobs must be an integer (the alternatives per token)", "logprobs")
    return n


def response_format(raw: Any) -> str | None:
    """``response_format`` as the JSON Schema text the output must match (None: text)."""
    if raw is None:
        return None
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return JSON_OBJECT_SCHEMA
    if kind != "json_schema":
        raise _format_error("must be {type: text | json_object | json_schema}")
    spec = raw.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise _format_error("json_schema needs {name, schema?, strict?}")
    schema = spec.get("schema", {})  # OpenAI's schema is optional: then any JSON
    if not isinstance(schema, dict | bool):
        raise _format_error("json_schema.schema must be a JSON Schema object")
    if spec.get("strict") not in (None, True, False):
        raise _format_error("json_schema.strict must be true or false")
    return json.dumps(schema, separators=(",", ":"), ensure_ascii=False)


def _format_error(why: str) -> ApiError:
    return ApiError.bad(f"response_format {why}", "response_format")
