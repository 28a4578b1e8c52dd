"""OpenAI request bodies -> one tandem Submit's parts, or a 400 saying what is wrong.

Checked by hand rather than by a schema library, so every refusal names its field
in OpenAI's error shape. Every field is honoured, ignored for a documented reason,
or refused (gateway/fields.py, docs/OPENAI.md): an unknown field is a 400, never
silently dropped. The sampling fields beyond the basics map in gateway/sampling.py.
tandem's own extras: ``top_k``, ``min_p``, ``repetition_penalty``, ``ignore_eos``,
``min_tokens`` and ``worker`` (a worker id or device label to pin the request to).
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

from tandem.client.errors import BadRequest
from tandem.client.session import make_submit, sampling_params
from tandem.common import protocol as p
from tandem.common.validation import MAX_MESSAGES
from tandem.gateway.bodies import too_many_messages
from tandem.gateway.errors import ApiError
from tandem.gateway.fields import check_fields
from tandem.gateway.sampling import OPENAI_PARAM, sampling_options

log = logging.getLogger(__name__)
# A JSON escape of a UTF-16 surrogate: the only way a lone one gets into decoded text.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")

CHAT_ROLES = {"system", "user", "assistant", "tool", "developer"}


@dataclass(frozen=True)
class Generation:
    """One parsed request: the model asked for, what to send, how to answer."""

    model: str | None
    sampling: p.SamplingParams  # built once, from OpenAI's fields (and tandem's extras)
    stream: bool
    include_usage: bool  # stream_options.include_usage: a last chunk with usage
    prompt: str | None = None  # exactly one of prompt / tokens / messages
    tokens: list[int] | None = None
    messages: list[dict[str, str]] | None = None
    worker: str | None = None  # a worker id or device label to pin the request to
    request_id: str = ""

    @cached_property
    def submit(self) -> p.Submit:
        """The Submit the client library sends for it, built and checked (as the
        router will check it) once: BadRequest naming the field."""
        return make_submit(
            self.prompt, tokens=self.tokens, messages=self.messages, stream=self.stream,
            request_id=self.request_id, worker=self.worker, sampling=self.sampling,
        )  # fmt: skip


def read_request(
    raw: bytes, chat: bool, default_max_tokens: int, request_id: str,
    max_messages: int = MAX_MESSAGES,
) -> Generation:  # fmt: skip
    """The one door of a request body: JSON, then its fields, then the Submit the
    gateway sends (``Generation.submit``), checked by the client library
    (client/checks.py). Whatever a body holds, the answer is a Generation or a 400
    ApiError naming what is wrong; a failure none of the checks foresaw is still the
    body's doing, so it is a 400 too (and logged, to add the check it shows is
    missing)."""
    try:
        body = decode_json(raw)
        parsed = (
            parse_chat(body, default_max_tokens, max_messages)
            if chat
            else parse_completion(body, default_max_tokens)
        )
        gen = replace(parsed, request_id=request_id)
        gen.submit  # noqa: B018 (built here, where its refusal becomes a 400)
    except ApiError:
        raise
    except BadRequest as exc:
        raise ApiError.bad(exc.message, _param(exc.field, raw)) from None
    except Exception as exc:
        log.warning("a request body no check refused failed to parse", exc_info=True)
        raise ApiError.bad(f"the request cannot be read: {type(exc).__name__}") from None
    return gen


def decode_json(raw: bytes) -> Any:
    """The body as JSON, refusing what no field may hold: nesting deeper than Python
    parses, and lone surrogates (``"\\udcff"``), which no UTF-8 text can carry on."""
    try:
        body = json.loads(raw)
    except RecursionError:
        raise ApiError.bad("the request body nests too deeply") from None
    except ValueError:  # UnicodeDecodeError included: bytes that are not UTF-8
        raise ApiError.bad("the request body is not valid JSON") from None
    if _SURROGATE_ESCAPE.search(raw):  # a pair is fine: write it back to find out
        try:
            json.dumps(body, ensure_ascii=False).encode()
        except UnicodeEncodeError:
            raise ApiError.bad(
                "the request body holds a lone UTF-16 surrogate escape (\\ud800-\\udfff)"
            ) from None
    return body


def _param(field: str | None, raw: bytes) -> str | None:
    """The OpenAI field for a Submit field the client library named."""
    if field is None:
        return None
    if field.startswith("tokens"):
        return "prompt"
    field = field.split("[")[0]  # logit_bias[...]: the field, not its entry
    if field == "logprobs" and b'"top_logprobs"' in raw:
        return "top_logprobs"
    if field == "max_tokens" and b'"max_completion_tokens"' in raw:
        return "max_completion_tokens"
    return OPENAI_PARAM.get(field, field)


def parse_chat(body: Any, default_max_tokens: int, max_messages: int = MAX_MESSAGES) -> Generation:
    """A ``POST /v1/chat/completions`` body."""
    body = _object(body)
    check_fields(body, chat=True)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError.bad("messages must be a non-empty list", "messages")
    if len(messages) > max_messages:  # counted before any is read
        raise too_many_messages(f"{len(messages)} chat messages", max_messages)
    options: dict[str, Any] = {"messages": [_message(m, i) for i, m in enumerate(messages)]}
    max_tokens = _int(body, "max_completion_tokens", 1)
    if max_tokens is None:
        max_tokens = _int(body, "max_tokens", 1)
    return _generation(body, options, max_tokens or default_max_tokens, chat=True)


def parse_completion(body: Any, default_max_tokens: int) -> Generation:
    """A ``POST /v1/completions`` body: one prompt, as text or token ids."""
    body = _object(body)
    check_fields(body, chat=False)
    options = _prompt(body.get("prompt"))
    if _int(body, "best_of", 1) not in (None, 1):
        raise ApiError.bad("best_of must be 1", "best_of")
    max_tokens = _int(body, "max_tokens", 1)
    return _generation(body, options, max_tokens or default_max_tokens, chat=False)


def _generation(body: dict, what: dict[str, Any], max_tokens: int, chat: bool) -> Generation:
    """``what``: the prompt, tokens or messages (Generation's field by name)."""
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError.bad("model must be a string", "model")
    if _int(body, "n", 1) not in (None, 1):
        raise ApiError.bad("n must be 1: tandem returns one choice per request", "n")
    temperature = _float(body, "temperature", 0.0, 2.0)
    top_p = _float(body, "top_p", 0.0, 1.0)
    if top_p == 0.0:
        raise ApiError.bad("top_p must be in (0, 1]", "top_p")
    sampling = sampling_params(
        max_tokens=max_tokens,
        # OpenAI's default temperature is 1, not tandem's greedy 0.
        temperature=1.0 if temperature is None else temperature,
        top_p=1.0 if top_p is None else top_p,
        top_k=_int(body, "top_k", 0) or 0,
        seed=_int(body, "seed", None),
        stop=_stop(body.get("stop")),
        ignore_eos=bool(_bool(body, "ignore_eos")),
        min_tokens=_int(body, "min_tokens", 0) or 0,
        **sampling_options(body, chat),  # gateway/sampling.py: the fields beyond these
    )
    stream = bool(_bool(body, "stream"))
    so = body.get("stream_options")
    if so is not None and not isinstance(so, dict):
        raise ApiError.bad("stream_options must be an object", "stream_options")
    include_usage = bool(_bool(so or {}, "include_usage", "stream_options.include_usage"))
    worker = _str(body, "worker")
    return Generation(model, sampling, stream, stream and include_usage, worker=worker, **what)


# ---------------------------------------------------------------- fields
def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ApiError.bad("the request body must be a JSON object")
    return body


def _message(m: Any, i: int) -> dict[str, str]:
    param = f"messages[{i}]"
    if not isinstance(m, dict) or not isinstance(m.get("role"), str) or m["role"] not in CHAT_ROLES:
        raise ApiError.bad(f"each message needs a role in {sorted(CHAT_ROLES)}", param)
    # OpenAI's newer "developer" role is what chat templates call "system".
    role = "system" if m["role"] == "developer" else m["role"]
    return {"role": role, "content": _content(m.get("content"), param)}


def _content(content: Any, param: str) -> str:
    if content is None:  # e.g. an assistant turn that only called tools
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise ApiError.bad("only text content parts are supported", f"{param}.content")
            if not isinstance(part.get("text"), str):
                raise ApiError.bad("a text part needs a string text", f"{param}.content")
            texts.append(part["text"])
        return "".join(texts)
    raise ApiError.bad("content must be a string or a list of text parts", f"{param}.content")


def _prompt(prompt: Any) -> dict[str, Any]:
    # One prompt per request: a string, token ids, or a list holding exactly one of those.
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str) and prompt:
        return {"prompt": prompt}
    if isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        return {"tokens": list(prompt)}
    raise ApiError.bad("prompt must be one non-empty string or one list of token ids", "prompt")


def _stop(stop: Any) -> list[str]:
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return list(stop)
    raise ApiError.bad("stop must be a string or a list of strings", "stop")


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _int(body: dict, name: str, minimum: int | None) -> int | None:
    x = body.get(name)
    if x is None:
        return None
    if not _is_int(x) or (minimum is not None and x < minimum):
        floor = "" if minimum is None else f" >= {minimum}"
        raise ApiError.bad(f"{name} must be an integer{floor}", name)
    return x


def _float(body: dict, name: str, lo: float, hi: float) -> float | None:
    x = body.get(name)
    if x is None:
        return None
    if not (_is_int(x) or isinstance(x, float)) or not lo <= x <= hi:
        raise ApiError.bad(f"{name} must be a number in [{lo:g}, {hi:g}]", name)
    return float(x)


def _bool(body: dict, name: str, param: str | None = None) -> bool | None:
    x = body.get(name)
    if x is not None and not isinstance(x, bool):
        raise ApiError.bad(f"{name} must be true or false", param or name)
    return x


def _str(body: dict, name: str) -> str | None:
    x = body.get(name)
    if x is not None and (not isinstance(x, str) or not x):
        raise ApiError.bad(f"{name} must be a non-empty string", name)
    return x
