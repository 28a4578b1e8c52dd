"""Messages to and from msgpack, with one msgspec decoder, and its refusals in words.

``Wire`` reads every frame once, in C: the tagged union of the message Structs
(common/protocol.py) checks each field's type and bounds, refuses unknown and
missing fields, and builds the message. Encoding packs the Struct as it is (its
tag first) and writes the protocol version into the map's head.

A frame msgspec refuses is read once more, by msgpack, only to say why in the
protocol's terms and in the order docs/PROTOCOL.md gives (a map, then its version,
then its type, then the field msgspec named): ``refusal`` returns that
(code, words, request id, field path).
"""

from __future__ import annotations

import re
from typing import Any, Union

import msgpack
import msgspec

from tandem.common.errors import ErrorCode

DECODE_ERRORS = (msgspec.DecodeError, msgspec.ValidationError)


class Wire:
    """The message classes' one decoder and encoder (``types_by_tag``: tag -> Struct)."""

    def __init__(self, types_by_tag: dict[str, type[Any]], version: int) -> None:
        self.version = version
        self.types = types_by_tag
        self.decode = msgspec.msgpack.Decoder(Union[tuple(types_by_tag.values())]).decode  # noqa: UP007
        self._pack = msgspec.msgpack.Encoder(enc_hook=_plain).encode
        self._head = msgspec.msgpack.encode("v") + msgspec.msgpack.encode(version)

    def encode(self, msg: Any) -> bytes:
        """A frame: ``msg``'s map with the version in front."""
        return _with_head(self._pack(msg), self._head, 1)

    def encode_entry(self, msg: Any) -> bytes:
        """A batch entry: ``msg``'s map as it is (the frame's version covers it)."""
        return self._pack(msg)

    def refusal(
        self, data: Any, exc: Exception, in_batch: bool
    ) -> tuple[ErrorCode, str, str | None, str | None]:
        """Why msgspec refused ``data`` (a frame, or a batch entry): the code, the
        words, the request id when readable and the refused field's path."""
        where = "batch entry" if in_batch else "frame"
        try:
            body = msgpack.unpackb(data, raw=False, strict_map_key=False)
        except Exception as err:  # msgpack raises several unrelated types
            return ErrorCode.BAD_FRAME, f"{where} is not valid msgpack: {err}", None, None
        if type(body) is not dict:
            return ErrorCode.BAD_FRAME, f"{where} must be a msgpack map", None, None
        if not all(type(k) is str for k in body):
            return ErrorCode.BAD_FRAME, f"{where} keys must be strings", None, None
        rid = body.get("request_id")
        rid = rid if type(rid) is str else None
        if not in_batch and body.get("v") != self.version:
            return ErrorCode.VERSION_MISMATCH, self.version_words(body.get("v")), rid, None
        tag = body.get("type")
        if type(tag) is not str or tag not in self.types or (in_batch and tag == "batch"):
            return (
                ErrorCode.BAD_FRAME,
                f"unknown message type {tag!r}{' in a batch' * in_batch}",
                rid,
                None,
            )
        words, path = explain(str(exc))
        return ErrorCode.BAD_REQUEST, f"{tag}{'.' + path if path else ''}: {words}", rid, path

    def version_words(self, version: Any) -> str:
        return (
            f"protocol version {version!r} is not supported (this peer speaks "
            f"{self.version}); upgrade the older side"
        )


_AT = re.compile(r"^(?P<what>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.S)
_KEY_AT = re.compile(r" - at `key` in `\$(?P<path>[^`]*)`$")
_NAMED = re.compile(r"Object (?:missing required|contains unknown) field `([^`]*)`")


def explain(text: str) -> tuple[str, str]:
    """msgspec's words for a refused value, in the protocol's: ``(what, path)``, e.g.
    ``("expected int, got str", "sampling.max_tokens")`` or
    ``("missing field 'cached'", "active[0]")``."""
    key = _KEY_AT.search(text)
    if key is not None:  # a map key of the wrong type
        what = text[: key.start()].replace("`", "")
        return f"{what[:1].lower()}{what[1:]} (a map key)", key.group("path").lstrip(".")
    m = _AT.match(text)
    what, path = (m.group("what"), m.group("path") or "") if m else (text, "")
    named = _NAMED.match(what)
    if named is not None:
        kind = "missing" if "missing" in what else "unknown"
        what = f"{kind} field {named.group(1)!r}"
    else:
        what = what.replace("`", "").replace("Invalid enum value", "unknown value")
        what = what[:1].lower() + what[1:]
    return what, path.lstrip(".")


def _plain(obj: Any) -> Any:
    """Values msgspec does not pack itself: numbers of other libraries (numpy's)."""
    item = getattr(obj, "item", None)
    if item is not None:
        return item()
    raise TypeError(f"cannot send a value of type {type(obj).__name__}")


def _with_head(body: bytes, head: bytes, extra: int) -> bytes:
    """``body`` (one packed map) with ``extra`` more entries, packed in ``head``, first."""
    first = body[0]
    if 0x80 <= first <= 0x8F:
        n, rest = first - 0x80, 1
    elif first == 0xDE:
        n, rest = int.from_bytes(body[1:3], "big"), 3
    else:  # 0xDF: a map of 65,536 fields or more is not a message
        n, rest = int.from_bytes(body[1:5], "big"), 5
    n += extra
    if n < 16:
        return b"".join((bytes((0x80 + n,)), head, memoryview(body)[rest:]))
    size = b"\xde" + n.to_bytes(2, "big") if n < 1 << 16 else b"\xdf" + n.to_bytes(4, "big")
    return b"".join((size, head, memoryview(body)[rest:]))
