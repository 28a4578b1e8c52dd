"""How deep a msgpack frame nests, found before any decoder recurses into it.

msgspec (and any recursive decoder) descends one C call per level of nesting and
raises RecursionError near the interpreter's limit: a ~1 KB frame nested 1,000 deep
did that inside the router's loop. ``scan`` reads only the frame's structure, with
an explicit stack: it never recurses, whatever the frame holds.

It is cheap for the frames tandem sends, which is every frame the router reads
hot (docs/results/reliability.md has the numbers):

- a frame of at most ``MAX_FRAME_DEPTH`` bytes cannot nest deeper: nothing to do;
- a frame with at most ``MAX_FRAME_DEPTH`` bytes that could be container headers
  (0x80-0x9f, 0xdc-0xdf, counted in C) cannot either;
- any other is walked item by item, runs of scalars and of small flat containers
  (a heartbeat's rows, ``[[id], [id], ...]``) matched by one regular expression in
  C, so Python steps only at larger containers, long strings and the like.

A frame the walk cannot parse is left to the decoder, which reads it in the same
order and fails at the same place: a sequential decoder never reaches what lies
past the first byte it cannot read.
"""

from __future__ import annotations

import re
from functools import cache

# No tandem message nests deeper than ~12 containers (the frame's map, a field, free-
# form values 8 deep: common/validation.MAX_DEPTH); the decoders' recursion is safe
# to ~900. A frame between 9 and 100 deep is refused by validation with its path.
MAX_FRAME_DEPTH = 100

_HEADS = bytes([*range(0x80, 0xA0), *range(0xDC, 0xE0)])  # fixmap, fixarray, 16/32-bit
_NOT_HEADS = bytes(b for b in range(256) if b not in _HEADS)


def _scalar_pattern() -> bytes:
    """One msgpack scalar of fixed or fix-encoded length (ints, floats, nil, bools,
    strings of up to 31 bytes); the others (str8+, bin, ext) are walked in Python.
    The regular expression engine tries alternatives in order: common ones first."""
    alts = [
        rb"[\x00-\x7f\xa0\xc0\xc2\xc3\xe0-\xff]",  # fixints, "", nil, false, true
        rb"\xcd..",  # token ids from 256 on
        rb"\xcc.",
        rb"[\xca\xce\xd2]....",
        rb"[\xcb\xcf\xd3]........",
        rb"\xd0.",
        rb"\xd1..",
    ]
    alts += [re.escape(bytes((0xA0 + n,))) + b"." * n for n in range(1, 32)]  # fixstr
    return b"(?:" + b"|".join(alts) + b")"


_S = _scalar_pattern()
# A scalar, or a fixarray / fixmap of scalars only (``[id]``, a heartbeat's row).
_FLAT = b"|".join(
    [_S]
    + [re.escape(bytes((0x90 + n,))) + _S + b"{%d}" % n for n in range(16)]
    + [re.escape(bytes((0x80 + n,))) + _S + b"{%d}" % (2 * n) for n in range(16)]
)
_LEN = {0xD9: 1, 0xC4: 1, 0xDA: 2, 0xC5: 2, 0xDB: 4, 0xC6: 4}  # str8..32, bin8..32
_EXT = {0xD4: 2, 0xD5: 3, 0xD6: 5, 0xD7: 9, 0xD8: 17}  # fixext: type byte + data
_EXT_LEN = {0xC7: 1, 0xC8: 2, 0xC9: 4}  # ext8..32: length, type byte, data
_CONTAINER = {0xDC: (2, 1), 0xDD: (4, 1), 0xDE: (2, 2), 0xDF: (4, 2)}  # width, items each


@cache
def _items(j: int, flat: bool) -> re.Pattern[bytes]:
    """Exactly 2**j items, scalars (or flat containers too, ``flat``), in one match."""
    return re.compile(b"(?:" + (_FLAT if flat else _S) + b"){%d}" % (1 << j), re.S)


def scan(frame: bytes) -> str | None:
    """``"too_deep"`` when ``frame`` nests deeper than MAX_FRAME_DEPTH, ``"too_large"``
    when a header claims more than the frame holds; None otherwise (including
    frames that are not msgpack at all: the decoder words those)."""
    if len(frame) <= MAX_FRAME_DEPTH or len(frame.translate(None, _NOT_HEADS)) <= MAX_FRAME_DEPTH:
        return None
    return _walk(frame)


def _walk(frame: bytes) -> str | None:
    n, pos = len(frame), 0
    left = [1]  # items still to read in each open container (the root: one item)
    while left:
        # As many of the innermost container's items as are flat, in C; flat
        # containers only while one more level stays within the limit.
        pos, read = _flat_run(frame, pos, left[-1], len(left) <= MAX_FRAME_DEPTH)
        left[-1] -= read
        if left[-1]:  # the next item nests (or is a long string, or not msgpack)
            head, items = _item(frame, pos, n)
            if head is None:
                return None if items == -1 else "too_large"
            pos = head
            left[-1] -= 1
            if items:
                left.append(items)
                if len(left) - 1 > MAX_FRAME_DEPTH:
                    return "too_deep"
        while left and not left[-1]:
            left.pop()
    return None


def _flat_run(frame: bytes, pos: int, k: int, flat: bool) -> tuple[int, int]:
    """Where the first of the next ``k`` items that is not flat starts (or the end
    of the ``k``), and how many were read: by chunks of 2**j items, a regular
    expression match each, largest first."""
    read, j = 0, k.bit_length() - 1
    while j >= 0:
        if (1 << j) <= k - read:
            m = _items(j, flat).match(frame, pos)
            if m is not None:
                pos, read = m.end(), read + (1 << j)
                continue
        j -= 1
    return pos, read


def _item(frame: bytes, pos: int, n: int) -> tuple[int | None, int]:
    """The next item's end (a container's: its header's) and how many items it
    opens; (None, -1) for what the walk cannot read (the decoder says why),
    (None, -2) for a length past the frame's end."""
    b = frame[pos]
    if 0x80 <= b <= 0x9F:  # a fixmap / fixarray the run did not take: it nests
        items = (b & 0x0F) * (2 if b < 0x90 else 1)
        return (pos + 1, items) if items <= n - pos else (None, -2)
    if b in _CONTAINER:
        width, each = _CONTAINER[b]
        items = int.from_bytes(frame[pos + 1 : pos + 1 + width], "big") * each
        end = pos + 1 + width
        return (end, items) if end <= n and items <= n - end else (None, -2)
    if b in _LEN or b in _EXT_LEN:
        width = _LEN.get(b) or _EXT_LEN[b]
        size = int.from_bytes(frame[pos + 1 : pos + 1 + width], "big")
        end = pos + 1 + width + size + (1 if b in _EXT_LEN else 0)
        return (end, 0) if end <= n else (None, -2)
    if b in _EXT:
        end = pos + 1 + _EXT[b]
        return (end, 0) if end <= n else (None, -2)
    return None, -1  # 0xc1 (never used), or a scalar cut short: not msgpack
