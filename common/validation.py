"""Bounds on every decoded message: what a well-typed frame must also satisfy.

``common.protocol.decode`` checks types; this module checks values, so that no
peer (a buggy worker, a stranger on the socket, a fuzzer) can put NaN rates, a
heartbeat period of 1e9 s, negative counters, megabyte ids or 10,000-deep maps
into the router's state. ``decode`` calls :func:`message_problem` on every
message it builds and turns a Problem into a ProtocolError, so the handlers only
ever see values inside the limits below (documented in docs/PROTOCOL.md).
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Callable
from functools import partial
from itertools import chain, compress
from operator import attrgetter, is_not, not_
from typing import TYPE_CHECKING, Any

from tandem.common.codec import str_keys
from tandem.common.errors import Problem

if TYPE_CHECKING:  # messages are read by attribute: nothing of the protocol at import
    from tandem.common import protocol as p

MAX_ID_CHARS = 256  # request ids, worker ids, labels
MAX_DEPTH = 8  # nesting of free-form maps (stats, cache reports, chat messages)
MAX_ACTIVE = 4096
MAX_N_CTX = 1 << 24
MAX_RATE_TOK_S = 1e9
HEARTBEAT_S = (0.01, 60.0)  # a worker's period: a 1e9 s period would never expire
MAX_COUNT = 1 << 40  # token counters in heartbeats
MAX_ROWS = 1 << 16  # requests one heartbeat may list
MAX_TOKENS_PER_FRAME = 1 << 16  # token ids in one TokenDelta (and in all of a StepTokens)
MAX_DELTAS_PER_FRAME = 1 << 12  # requests in one StepTokens
MAX_BATCH = 1 << 12  # messages in one batch frame
MAX_TOKEN_ID = 1 << 31
MAX_TEXT_CHARS = 1 << 20
MAX_STATS_KEYS = 64
NUMERIC_STATS = (
    "prompt_tokens",
    "cached_tokens",
    "output_tokens",
    "worker_queue_s",
    "prefill_s",
    "decode_s",
)

Check = Callable[[Any], "Problem | None"]


def message_problem(msg: p.Message) -> Problem | None:
    """What puts ``msg`` outside the protocol's bounds, or None."""
    if msg.TYPE == "batch":  # its entries are checked one by one as it is unpacked
        return _within("len(messages)", len(msg.messages), 1, MAX_BATCH)  # type: ignore[attr-defined]
    # The fast walk decides; only a frame it refuses pays for naming the place.
    loose = _loose_fields(type(msg))
    # By attribute: msgspec leaves a field at its class default unset on the instance.
    if loose and not _tree_ok({name: getattr(msg, name) for name in loose}, 0):
        fields = {name: getattr(msg, name) for name in _field_names(type(msg))}
        problem = _tree_problem(fields, 0)
        if problem is not None:
            return problem
    check = _CHECKS.get(msg.TYPE)
    return check(msg) if check is not None else None


_LOOSE: dict[type[Any], tuple[str, ...]] = {}
_NAMES: dict[type[Any], tuple[str, ...]] = {}


def _field_names(cls: type[Any]) -> tuple[str, ...]:
    names = _NAMES.get(cls)
    if names is None:
        names = _NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


def _loose_fields(cls: type[Any]) -> tuple[str, ...]:
    """The fields of ``cls`` the walk must look into: free-form (``Any``) values, which
    may nest and hold anything. The decoder gives every other field its declared type
    exactly (str, int, bool, float, lists of them, enums), which cannot nest deeper
    than declared; a declared float's range (NaN and infinities included) is its
    message's own check (tests/unit/test_protocol.py holds every float field to it)."""
    names = _LOOSE.get(cls)
    if names is None:
        hints = typing.get_type_hints(cls)
        fields = dataclasses.fields(cls)
        names = _LOOSE[cls] = tuple(f.name for f in fields if _loose(hints[f.name]))
    return names


def _loose(hint: Any) -> bool:
    if hint is Any:
        return True
    if dataclasses.is_dataclass(hint):
        hints = typing.get_type_hints(hint)
        return any(_loose(hints[f.name]) for f in dataclasses.fields(hint))
    return any(map(_loose, typing.get_args(hint)))


def _bad(what: str) -> Problem:
    return Problem.bad_request(what)


_PLAIN = frozenset({str, int, bool, type(None)})  # nothing to check below these


def _tree_ok(value: Any, depth: int) -> bool:
    """``_tree_problem(value) is None``, without building a path for every value
    (this runs on every frame: token deltas are the router's hot path)."""
    if depth > MAX_DEPTH:
        return False
    if type(value) in _PLAIN:
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        if not str_keys(value):  # msgspec reads any key inside a free-form value
            return False
        values: Any = value.values()
    elif isinstance(value, list | tuple):
        if not value or isinstance(value[0], int):
            return True  # token lists: ints only (typed by the decoder), no need to walk
        values = value
    elif hasattr(value, "__dataclass_fields__"):
        values = [getattr(value, name) for name in _field_names(type(value))]
    else:
        return True
    if depth >= MAX_DEPTH:  # every child is one level too deep, but plain ones?
        return all(_tree_ok(v, depth + 1) for v in values)
    # A child one level down may still be a plain value: those are passed over in C
    # (most fields: ids, counts, flags), the others looked at here in their order.
    for v in compress(values, map(not_, map(_PLAIN.__contains__, map(type, values)))):
        t = type(v)
        if t is float:  # checked here: a call per number costs more than the test
            if not math.isfinite(v):
                return False
            continue
        if t is list and (not v or isinstance(v[0], int)):  # a token list: the call's answer
            continue
        if not _tree_ok(v, depth + 1):
            return False
    return True


def _tree_problem(value: Any, depth: int, path: str = "") -> Problem | None:
    """Free-form values: finite numbers only, nesting at most MAX_DEPTH."""
    if depth > MAX_DEPTH:
        return _bad(f"values nest deeper than {MAX_DEPTH} levels (at {path})")
    if isinstance(value, float) and not math.isfinite(value):
        return _bad(f"{path} must be a finite number, got {value!r}")
    if isinstance(value, dict):
        if not str_keys(value):  # msgspec reads any key inside a free-form value
            return _bad(f"map keys must be strings (at {path or 'the message'})")
        items: Any = value.items()
    elif isinstance(value, list | tuple):
        if value and isinstance(value[0], int):
            return None  # token lists: ints only (typed by the decoder), no need to walk
        items = enumerate(value)
    elif hasattr(value, "__dataclass_fields__"):
        items = [(name, getattr(value, name)) for name in _field_names(type(value))]
    else:
        return None
    for key, v in items:
        problem = _tree_problem(v, depth + 1, f"{path}.{key}" if path else str(key))
        if problem is not None:
            return problem
    return None


def _id_problem(name: str, value: str | None, required: bool = True) -> Problem | None:
    if value is None or (not value and not required):
        return None
    if not value or len(value) > MAX_ID_CHARS or not value.isprintable():
        return _bad(f"{name} must be 1..{MAX_ID_CHARS} printable characters")
    return None


def _within(name: str, value: float, lo: float, hi: float) -> Problem | None:
    if not lo <= value <= hi:
        what = "a finite number " if not math.isfinite(value) else ""
        return _bad(f"{name} must be {what}in [{lo:g}, {hi:g}], got {value!r}")
    return None


def _first(*problems: Problem | None) -> Problem | None:
    return next((x for x in problems if x is not None), None)


def _ready(m: p.Ready) -> Problem | None:
    return _first(
        _id_problem("worker_id", m.worker_id),
        *(_id_problem(k, getattr(m, k)) for k in ("backend", "device", "model")),
        _id_problem("instance", m.instance, required=False),
        _id_problem("weights", m.weights, required=False),
        _within("max_active", m.max_active, 1, MAX_ACTIVE),
        _within("n_ctx", m.n_ctx, 1, MAX_N_CTX),
        _within("block_size", m.block_size, 1, 4096),
        _within("max_tokens_limit", m.max_tokens_limit, 1, MAX_N_CTX),
        _within("step_tokens", m.step_tokens, m.max_active, MAX_N_CTX),
        _within("prefill_tok_s", m.prefill_tok_s, 1e-3, MAX_RATE_TOK_S),
        _within("heartbeat_s", m.heartbeat_s, *HEARTBEAT_S),
        _within("len(decode_tok_s)", len(m.decode_tok_s), 1, m.max_active),
        *(_within("decode_tok_s", r, 1e-3, MAX_RATE_TOK_S) for r in m.decode_tok_s),
    )


def _row(r: p.RequestRow) -> Problem | None:
    counts = (r.prompt, r.cached, r.prefill_remaining, r.decode_remaining)
    return _first(
        _id_problem("row id", r.id), *(_within("row counter", c, 0, MAX_COUNT) for c in counts)
    )


_row_id = attrgetter("id")
_row_counts = attrgetter("prompt", "cached", "prefill_remaining", "decode_remaining")


def _heartbeat(m: p.Heartbeat) -> Problem | None:
    rows = m.active + m.queued
    return _first(
        _id_problem("worker_id", m.worker_id),
        _within("seq", m.seq, 0, 1 << 62),
        _within("rows", len(rows), 0, MAX_ROWS),
        _within("kv_used_tokens", m.kv_used_tokens, 0, MAX_COUNT),
        _within("kv_capacity_tokens", m.kv_capacity_tokens, 0, MAX_COUNT),
        _rows_problem(rows),
    )


def _rows_problem(rows: list[p.RequestRow]) -> Problem | None:
    """``_row`` of each row; a busy worker lists tens of rows in every heartbeat, so
    the common case is decided in a few passes in C, and only a heartbeat with a bad
    row walks them one by one to name it."""
    if not rows:
        return None
    ids = list(map(_row_id, rows))
    counts = list(chain.from_iterable(map(_row_counts, rows)))
    lengths = list(map(len, ids))
    if (
        min(counts) >= 0
        and max(counts) <= MAX_COUNT
        and min(lengths) > 0
        and max(lengths) <= MAX_ID_CHARS
        and all(map(str.isprintable, ids))
    ):
        return None
    return _first(*(_row(r) for r in rows))


_NUMBERS = frozenset({int, float})
_not_none = partial(is_not, None)


def _done(m: p.Done) -> Problem | None:
    if len(m.stats) > MAX_STATS_KEYS:
        return _bad(f"done.stats has more than {MAX_STATS_KEYS} keys")
    given = list(filter(_not_none, map(m.stats.get, NUMERIC_STATS)))
    if _NUMBERS.issuperset(map(type, given)) and (not given or min(given) >= 0):
        return _id_problem("request_id", m.request_id)  # the loop below would pass them all
    for key in NUMERIC_STATS:
        v = m.stats.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float) or v < 0):
            return _bad(f"done.stats.{key} must be a number >= 0, got {v!r}")
    return _id_problem("request_id", m.request_id)


def _tokens(m: p.TokenDelta) -> Problem | None:
    return _delta(m.request_id, m.token_ids, m.text)


def _delta(rid: str, ids: list[int], text: str) -> Problem | None:
    """One delta's bounds (a TokenDelta's, or an entry of a StepTokens)."""
    common_case = (
        0 < len(rid) <= MAX_ID_CHARS
        and rid.isprintable()
        and len(ids) <= MAX_TOKENS_PER_FRAME
        and (not ids or (min(ids) >= 0 and max(ids) <= MAX_TOKEN_ID))
        and len(text) <= MAX_TEXT_CHARS
    )
    if common_case:
        return None  # checked without a call per token; otherwise name the problem
    return _first(
        _id_problem("request_id", rid),
        _within("len(token_ids)", len(ids), 0, MAX_TOKENS_PER_FRAME),
        *(_within("token id", t, 0, MAX_TOKEN_ID) for t in ids),
        _within("len(text)", len(text), 0, MAX_TEXT_CHARS),
    )


def _step_tokens(m: p.StepTokens) -> Problem | None:
    n = len(m.request_ids)
    if not (len(m.token_ids) == n == len(m.texts)):
        return _bad(
            f"step_tokens: {n} request_ids, {len(m.token_ids)} token_ids lists and "
            f"{len(m.texts)} texts (one of each per request)"
        )
    if n > MAX_DELTAS_PER_FRAME:
        return _within("len(request_ids)", n, 0, MAX_DELTAS_PER_FRAME)
    total = sum(map(len, m.token_ids))
    if total > MAX_TOKENS_PER_FRAME:
        return _within("token ids in the frame", total, 0, MAX_TOKENS_PER_FRAME)
    for entry in zip(m.request_ids, m.token_ids, m.texts, strict=True):
        problem = _delta(*entry)
        if problem is not None:
            return problem
    return None


def _assign(m: p.Assign) -> Problem | None:
    return _first(
        _id_problem("request_id", m.request_id),
        _within("resume", m.resume, 0, len(m.tokens)),
        m.sampling.problem(),
    )


def _submit(m: p.Submit) -> Problem | None:
    # In turn, not through _first: every client frame passes here.
    problem = _id_problem("request_id", m.request_id)
    if problem is None:
        problem = _id_problem("worker", m.worker)
    return m.sampling.problem() if problem is None else problem


def _error(m: p.Error) -> Problem | None:
    if m.retry_after_s is not None and not 0 <= m.retry_after_s <= 3600:
        return _bad("retry_after_s must be in [0, 3600]")
    return _within("len(message)", len(m.message), 0, MAX_TEXT_CHARS)


_CHECKS: dict[str, Check] = {  # by message tag
    "ready": _ready,
    "heartbeat": _heartbeat,
    "done": _done,
    "tokens": _tokens,
    "step_tokens": _step_tokens,
    "assign": _assign,
    "submit": _submit,
    "error": _error,
    "cancel": lambda m: _id_problem("request_id", m.request_id),
    "goodbye": lambda m: _id_problem("worker_id", m.worker_id),
}
