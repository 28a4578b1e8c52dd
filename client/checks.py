"""What the client library checks before a Submit leaves: that every field can be
encoded at all, then that the router's decoder would take it, naming the field.

msgpack carries integers in [-2**63, 2**64) and UTF-8 text only, so
``max_tokens=2**64`` would raise OverflowError and a lone surrogate (``"\\udcff"``,
which Python strings may hold) UnicodeEncodeError, in the middle of a send: here
both become a ``BadRequest`` naming the field. Types, ranges and the sampling rules
are not restated here: ``protocol.check`` runs the router's own decoding of the
Submit (the one place they are declared). The gateway asks the same question of
every request it parses.
"""

from __future__ import annotations

import math
from typing import Any

from tandem.client.errors import BadRequest
from tandem.common import protocol as p
from tandem.common.validation import MAX_MESSAGES, MAX_N_CTX

INT_END = 2**63  # the ends of the integer fields: what both sides store in 64 bits
SEED_END = 2**64
MAX_NESTING = 32  # of a chat message's free-form values; the router allows fewer


def check_submit(sub: p.Submit) -> None:
    """Raise BadRequest (``field`` set) for the first field of ``sub`` the wire cannot carry."""
    _text("request_id", sub.request_id)
    if sub.prompt is not None:
        _text("prompt", sub.prompt)
    if sub.tokens is not None:
        _tokens(sub.tokens)
    if sub.messages is not None:
        if not isinstance(sub.messages, list):
            raise BadRequest("messages must be a list of messages", field="messages")
        if len(sub.messages) > MAX_MESSAGES:  # counted before any of them is walked
            n = len(sub.messages)
            raise BadRequest(f"{n} chat messages; at most {MAX_MESSAGES}", field="messages")
        for i, m in enumerate(sub.messages):
            _value(f"messages[{i}]", m, 0)
    if sub.worker is not None:
        _text("worker", sub.worker)
    _flag("stream", sub.stream)
    _sampling(sub.sampling)
    refused = p.check(sub)  # the router's own decoding of it: types, bounds and rules
    if refused is not None:
        field = refused.field.removeprefix("sampling.") if refused.field else None
        raise BadRequest(refused.message, field=field)


def _sampling(s: p.SamplingParams) -> None:
    """Each field encodable (its type and range are the decoder's, in ``p.check``)."""
    if not isinstance(s, p.SamplingParams):
        raise BadRequest("sampling must be a SamplingParams", field="sampling")
    # The decoder's bound is 0..MAX_N_CTX (0: prefill_only alone): say the range that
    # holds for this request, not ">= 0" nor the 64-bit ends of any integer.
    low = 0 if s.prefill_only is True else 1
    if type(s.max_tokens) is int and not low <= s.max_tokens <= MAX_N_CTX:
        words = f"max_tokens must be in {low}..{MAX_N_CTX}, got {s.max_tokens}"
        raise BadRequest(words, field="max_tokens")
    for name in s.__struct_fields__:
        _value(name, getattr(s, name), 0)


def _tokens(tokens: Any) -> None:
    if not isinstance(tokens, list):
        raise BadRequest("tokens must be a list of token ids", field="tokens")
    # Checked in C first (a prompt may hold 131,072 ids); walked only to name a bad one.
    ints = set(map(type, tokens)) <= {int}
    if ints and (not tokens or 0 <= min(tokens) <= max(tokens) < INT_END):
        return
    for i, t in enumerate(tokens):
        _int(f"tokens[{i}]", t, 0, INT_END)


def _value(path: str, x: Any, depth: int) -> None:
    """A free-form value (a chat message): text, numbers, lists and maps the wire carries."""
    if depth > MAX_NESTING:
        raise BadRequest(f"{path} nests deeper than {MAX_NESTING} levels", field=path)
    if isinstance(x, str):
        _text(path, x)
    elif isinstance(x, bool) or x is None:
        pass
    elif isinstance(x, int):
        _int(path, x, -INT_END, SEED_END)
    elif isinstance(x, float):
        if not math.isfinite(x):
            raise BadRequest(f"{path} must be a finite number", field=path)
    elif isinstance(x, list | tuple):
        for i, item in enumerate(x):
            _value(f"{path}[{i}]", item, depth + 1)
    elif isinstance(x, dict):
        for k, v in x.items():
            if isinstance(k, int) and not isinstance(k, bool):  # logit_bias: token ids
                _int(f"{path} key", k, -INT_END, SEED_END)
            elif not isinstance(k, str):
                raise BadRequest(f"{path} has a key that is not text: {_shown(k)}", field=path)
            else:
                _text(f"{path} key", k)
            _value(f"{path}.{k}", v, depth + 1)
    else:
        raise BadRequest(f"{path} cannot be sent: a {type(x).__name__}", field=path)


def _text(field: str, x: Any) -> None:
    if not isinstance(x, str):
        raise BadRequest(f"{field} must be a string, not {_shown(x)}", field=field)
    if x.isascii():  # the common case, and no scan: ASCII text always encodes
        return
    try:
        x.encode()
    except UnicodeEncodeError as exc:
        raise BadRequest(
            f"{field} is not valid Unicode text: a lone surrogate "
            f"{x[exc.start]!a} at index {exc.start}",
            field=field.removesuffix(" key"),
        ) from None


def _int(field: str, x: Any, lo: int, end: int) -> None:
    if not isinstance(x, int) or isinstance(x, bool):
        raise BadRequest(f"{field} must be an integer, not {_shown(x)}", field=field)
    if not lo <= x < end:
        raise BadRequest(f"{field} must be in [{_pow(lo)}, {_pow(end)})", field=field)


def _flag(field: str, x: Any) -> None:
    if not isinstance(x, bool):
        raise BadRequest(f"{field} must be true or false, not {_shown(x)}", field=field)


def _is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _pow(n: int) -> str:
    """Powers of two by name: ``2**63`` reads better than 9223372036854775808."""
    if n and abs(n).bit_count() == 1 and abs(n) > 1024:
        return f"{'-' if n < 0 else ''}2**{abs(n).bit_length() - 1}"
    return str(n)


def _shown(x: Any) -> str:
    """A value as an error message shows it: its type, and short ones in full."""
    text = ascii(x)
    return f"{type(x).__name__} {text}" if len(text) <= 40 else type(x).__name__
