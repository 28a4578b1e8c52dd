"""A request body priced before it is parsed, and a large one parsed off the loop.

A 4 MiB chat body of 123k tiny messages cost the event loop ~55 ms in ``json.loads``
alone (which holds the GIL throughout), then a Python step per message to check it
and build the Submit; 20 such bodies at once stood /health still for 12.7 s
(docs/results/reliability.md). So, before anything is parsed:

- the body's chat messages are counted from its bytes (every message needs a
  ``"role"`` key; ``bytes.count`` reads 4 MiB in ~4 ms) and a body with more than
  ``max_messages`` is refused at once. A key spelled with escapes (``"\\u0072ole"``)
  escapes this count, not the exact one made once the JSON is read;
- a body larger than ``OFF_LOOP_BYTES`` is parsed (JSON, fields, the Submit and its
  checks) on a thread, at most ``parsers`` at once: the loop answers /health and
  streams meanwhile, and no more than that many bodies' objects are alive at once.
"""

from __future__ import annotations

import asyncio
import itertools
import re
from collections.abc import Callable
from typing import TypeVar

from tandem.gateway.errors import ApiError

OFF_LOOP_BYTES = 64 << 10  # below this, parsing costs the loop less than the hand-off
PARSERS = 2  # bodies parsed at once; more would only queue for the GIL
_ROLE = b'"role"'
_ROLE_KEY = re.compile(rb'"role"\s*:')  # a key (a value "role" is followed by , ] or })
T = TypeVar("T")


def too_many_messages(what: str, limit: int) -> ApiError:
    """The 400 for a body with over ``limit`` messages; ``what``: how many it holds."""
    return ApiError.bad(f"{what}; a request may hold at most {limit} chat messages", "messages")


def count_messages(raw: bytes, limit: int) -> None:
    """400 when ``raw`` holds more than ``limit`` ``"role"`` keys: more chat messages
    than a request may hold, found without parsing it."""
    if raw.count(_ROLE) <= limit:  # the usual case: one C pass, no regular expression
        return
    keys = _ROLE_KEY.finditer(raw)
    if next(itertools.islice(keys, limit, None), None) is not None:  # stops at limit + 1
        raise too_many_messages(
            f'over {limit} chat messages ("role" {raw.count(_ROLE)} times)', limit
        )


class Parsers:
    """Where bodies are parsed: small ones on the loop, large ones on threads, at most
    ``parsers`` at once (the rest wait their turn without holding a thread)."""

    def __init__(self, parsers: int = PARSERS, off_loop_bytes: int = OFF_LOOP_BYTES) -> None:
        self.off_loop_bytes = off_loop_bytes
        self._slots = asyncio.Semaphore(parsers)

    async def parse(self, parse: Callable[[bytes], T], raw: bytes) -> T:
        if len(raw) < self.off_loop_bytes:
            return parse(raw)
        async with self._slots:
            return await asyncio.to_thread(parse, raw)
