"""The protocol's bounds: declared once as types, plus the checks types cannot say.

Every bound on a single value is part of its field's type (``Annotated[..., Meta]``,
below), so the one msgspec decoder that reads a frame (common/codec.py) refuses it
in C, naming the field. What remains here, run on each decoded message by
``common.protocol.decode``:

- rules across fields (``message_problem``): a StepTokens' lists of equal length,
  a Ready's ``step_tokens >= max_active``, an Assign's ``resume <= len(tokens)``,
  the sampling rules of a Submit (``SamplingParams.problem``);
- free-form values (``Any``: chat messages, a status reply, a tokenizer spec):
  string keys, finite numbers and at most MAX_DEPTH levels (``tree_problem``).

docs/PROTOCOL.md lists every bound.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

from msgspec import Meta

from tandem.common.errors import Problem

if TYPE_CHECKING:  # messages are read by attribute: nothing of the protocol at import
    from tandem.common import protocol as p

MAX_ID_CHARS = 256  # request ids, worker ids, labels
MAX_DEPTH = 8  # nesting of free-form values (chat messages, status rows, a tokenizer spec)
MAX_ACTIVE = 4096
MAX_N_CTX = 1 << 24
# Beyond any device: a small model's prefill on the largest GPU runs ~1e6 tok/s.
MAX_RATE_TOK_S = 1e8
MIN_RATE_TOK_S = 1e-3
HEARTBEAT_S = (0.01, 60.0)  # a worker's period: a 1e9 s period would never expire
MAX_COUNT = 1 << 40  # token counters in heartbeats
MAX_ROWS = 1 << 16  # requests one heartbeat may list
MAX_TOKENS_PER_FRAME = 1 << 16  # token ids in one TokenDelta (and in all of a StepTokens)
MAX_DELTAS_PER_FRAME = 1 << 12  # requests in one StepTokens
MAX_BATCH = 1 << 12  # messages in one batch frame
MAX_TOKEN_ID = 1 << 31
MAX_TEXT_CHARS = 1 << 20
MAX_STOP_STRINGS = 16
MAX_LOGIT_BIAS = 300  # entries, as OpenAI's
MAX_LOGPROBS = 20  # alternatives per token, as OpenAI's top_logprobs
MAX_SCHEMA_CHARS = 1 << 18  # a JSON Schema's text
# Chat messages in one Submit: checked from the msgpack array's header, before any
# message is decoded (a 4 MiB body holds 123k tiny ones, each rendered by the chat
# template and tokenized: 20 such requests stood a router still for seconds).
MAX_MESSAGES = 4096
# A worker's step model (common/steptime.py StepModel, Heartbeat.steps).
STEP_POINTS = 64  # entries per list: one per batch size or chunk bucket
MAX_STEP_S = 3600.0
MIN_STEP_S = 1e-6  # no engine step is shorter: one kernel launch takes longer
MAX_CONTEXT = 10_000_000  # tokens of context per row
COUNT_CAP = 1_000_000  # sample counters stop here (they only weigh evidence)
MAX_CHUNK = 1 << 30  # prompt tokens in a prefill chunk bucket
# Block hashes one cache listing may hold: 8.4 M tokens in blocks of 16, more than any
# device and host tier serve today; ~60 MB of the router's memory (broker/peerbounds.py).
MAX_CACHE_BLOCKS = 1 << 19
MAX_FLOAT = sys.float_info.max  # ``le=MAX_FLOAT`` refuses infinity; every bound refuses NaN

# The bounded types the messages are declared with (common/protocol.py).
# Ids and labels: no control characters (they end up in logs and metric labels).
Id = Annotated[
    str, Meta(min_length=1, max_length=MAX_ID_CHARS, pattern=r"^[^\x00-\x1f\x7f-\x9f]+\Z")
]
# An id that names what its receiver already knows (a token frame's request): only
# bounded, for the router drops an id it does not know, and a pattern per id cost the
# 64-delta step frame 30 of its 50 us to decode (docs/results/router-overhead.md).
Ref = Annotated[str, Meta(min_length=1, max_length=MAX_ID_CHARS)]
Label = Annotated[
    str, Meta(max_length=MAX_ID_CHARS, pattern=r"^[^\x00-\x1f\x7f-\x9f]*\Z")
]  # "" = unset
# A machine's name (common/nodes.py): plain and short, as it labels /metrics series.
NodeName = Annotated[str, Meta(max_length=64, pattern=r"^([A-Za-z0-9][A-Za-z0-9._-]{0,63})?\Z")]
Count = Annotated[int, Meta(ge=0, le=MAX_COUNT)]
TokenId = Annotated[int, Meta(ge=0, le=MAX_TOKEN_ID)]
Tokens = Annotated[list[TokenId], Meta(max_length=MAX_TOKENS_PER_FRAME)]
Text = Annotated[str, Meta(max_length=MAX_TEXT_CHARS)]
Rate = Annotated[float, Meta(ge=MIN_RATE_TOK_S, le=MAX_RATE_TOK_S)]
Seconds = Annotated[float, Meta(ge=0, le=1e9)]
NonNegative = Annotated[float, Meta(ge=0, le=MAX_FLOAT)]

Check = Callable[[Any], "Problem | None"]


def message_problem(msg: p.Message) -> Problem | None:
    """What breaks a rule across ``msg``'s fields or a bound of its free-form values,
    or None (its types and single-value bounds were checked as it was decoded)."""
    check = _CHECKS.get(msg.TYPE)
    return check(msg) if check is not None else None


def _bad(what: str) -> Problem:
    return Problem.bad_request(what)


_INT = frozenset({int})


def tree_problem(value: Any, depth: int = 0, path: str = "") -> Problem | None:
    """A free-form value: string keys, finite numbers only, nesting at most MAX_DEPTH."""
    if depth > MAX_DEPTH:
        return _bad(f"values nest deeper than {MAX_DEPTH} levels (at {path})")
    if isinstance(value, float) and not math.isfinite(value):
        return _bad(f"{path} must be a finite number, got {value!r}")
    if isinstance(value, dict):
        if not all(type(k) is str for k in value):  # msgspec reads any key inside Any
            return _bad(f"map keys must be strings (at {path or 'the message'})")
        items: Any = value.items()
    elif isinstance(value, list):
        if _INT.issuperset(map(type, value)):  # ids and hashes: checked in C, no walk
            return None
        items = enumerate(value)
    else:
        return None
    for key, v in items:
        problem = tree_problem(v, depth + 1, f"{path}.{key}" if path else str(key))
        if problem is not None:
            return problem
    return None


def _within(name: str, value: float, lo: float, hi: float) -> Problem | None:
    if not lo <= value <= hi:
        return _bad(f"{name} must be in [{lo:g}, {hi:g}], got {value!r}")
    return None


def _first(*problems: Problem | None) -> Problem | None:
    return next((x for x in problems if x is not None), None)


def _ready(m: p.Ready) -> Problem | None:
    return _first(
        _within("step_tokens", m.step_tokens, m.max_active, MAX_N_CTX),
        _within("len(decode_tok_s)", len(m.decode_tok_s), 1, m.max_active),
        tree_problem(m.tokenizer, 1, "tokenizer"),
    )


def _heartbeat(m: p.Heartbeat) -> Problem | None:
    return _within("rows", len(m.active) + len(m.queued), 0, MAX_ROWS)


def _step_tokens(m: p.StepTokens) -> Problem | None:
    n = len(m.request_ids)
    if not (len(m.token_ids) == n == len(m.texts)):
        return _bad(
            f"step_tokens: {n} request_ids, {len(m.token_ids)} token_ids lists and "
            f"{len(m.texts)} texts (one of each per request)"
        )
    if m.logprobs is not None:
        if len(m.logprobs) != n:
            return _bad(f"step_tokens: {len(m.logprobs)} logprobs entries for {n} requests")
        for ids, lps in zip(m.token_ids, m.logprobs, strict=True):
            if lps is not None and len(lps) != len(ids):
                return _bad(f"step_tokens: {len(lps)} logprobs for {len(ids)} token ids")
    return _within("token ids in the frame", sum(map(len, m.token_ids)), 0, MAX_TOKENS_PER_FRAME)


def _token_delta(m: p.TokenDelta) -> Problem | None:
    if m.logprobs is not None and len(m.logprobs) != len(m.token_ids):
        return _bad(f"tokens: {len(m.logprobs)} logprobs for {len(m.token_ids)} token ids")
    return None


def schema_problem(text: str) -> Problem | None:
    """A json_schema that is not the JSON text of a schema (an object, or a boolean)."""
    try:
        schema = json.loads(text)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested past Python's stack
        return Problem.bad_request(f"json_schema is not JSON: {exc}", "sampling.json_schema")
    if not isinstance(schema, dict | bool):
        why = "json_schema must be a JSON Schema: an object (or true / false)"
        return Problem.bad_request(why, "sampling.json_schema")
    return None


def _assign(m: p.Assign) -> Problem | None:
    return _within("resume", m.resume, 0, len(m.tokens))


def submit_problem(m: p.Submit) -> Problem | None:
    """What keeps a Submit from being served, or None: the one place its rules live.
    The router runs it as it decodes a Submit (and its core on one handed to it
    directly); the client library and the gateway run it through ``protocol.check``
    before one leaves. Single values are bounded by their types, above."""
    given = [x is not None for x in (m.prompt, m.tokens, m.messages)]
    if sum(given) != 1:
        return Problem.bad_request("give exactly one of prompt, tokens or messages")
    if not m.request_id:
        return Problem.bad_request("request_id must be a non-empty string", "request_id")
    for name in ("prompt", "tokens", "messages"):
        value = getattr(m, name)
        if value is not None and not value:
            return Problem.bad_request(f"{name} is empty", name)
    problem = m.sampling.problem()
    if problem is None and m.messages is not None:
        problem = tree_problem(m.messages, 1, "messages")
    return problem


def _status_reply(m: p.StatusReply) -> Problem | None:
    return (
        tree_problem(m.workers, 1, "workers")
        or tree_problem(m.activity, 1, "activity")
        or tree_problem(m.starting, 1, "starting")
    )


_CHECKS: dict[str, Check] = {  # by message tag; the others have no rule across fields
    "ready": _ready,
    "heartbeat": _heartbeat,
    "step_tokens": _step_tokens,
    "tokens": _token_delta,
    "assign": _assign,
    "submit": submit_problem,
    "status_reply": _status_reply,
}
