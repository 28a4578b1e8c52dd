"""Dataclasses to and from msgpack maps, every field checked, at msgpack's cost.

Two paths over the same declarations:

- ``Wire``, the fast path every frame takes: msgspec (a well-kept C library for
  typed MessagePack) checks a frame against a Struct generated from its dataclass
  and builds the dataclass, in C; encoding packs the dataclass as it is. With the
  bounds checks (common/validation.py), a short Submit decodes in ~9 us against
  ~24 by the hand-written path below, a token frame in ~3 against ~7; an Assign
  encodes in ~2 against ~6; the router's CPU per routed request fell ~18 %
  (docs/results/router-overhead.md, twelfth session).
- ``codec_for(cls)``, the hand-written path, words the error of a frame the fast
  path refused, in the protocol's own codes and messages (tests and peers rely on
  them); it runs only then. It compiles a class once: its type hints are resolved
  and each field gets a checker built for its declared type (nested dataclasses,
  lists of them, StrEnums, ``X | None``, ``list[int]``, ``dict[str, Any]``, ...).

Both check scalar and list items by exact type: ``bool`` is never an ``int`` here,
and an ``int`` is accepted (and converted) where a ``float`` field is declared.
What msgspec reads more freely than msgpack's strict mode — keys other than
strings inside free-form (``Any``) values — common/validation.py refuses.
"""

from __future__ import annotations

import dataclasses
import operator
import types
import typing
from collections.abc import Callable
from enum import StrEnum
from functools import partial
from itertools import compress
from operator import contains, not_
from typing import Any, Union

import msgspec

Check = Callable[[Any], Any]  # returns the (possibly converted) value or raises FieldError

_EXACT: dict[Any, frozenset[type]] = {
    int: frozenset({int}),
    float: frozenset({int, float}),
    str: frozenset({str}),
    bool: frozenset({bool}),
}


class FieldError(ValueError):
    """A map does not fit its dataclass; the message names the class and field."""


def label(cls: type[Any]) -> str:
    """A class's name in messages: its wire tag (``TYPE``) when it has one."""
    return getattr(cls, "TYPE", "") or cls.__name__


def _no_values(body: dict[str, Any]) -> tuple[()]:
    return ()


def _one_value(name: str, body: dict[str, Any]) -> tuple[Any]:
    return (body[name],)


class Codec:
    """The compiled form of one dataclass (built once per class by ``codec_for``)."""

    def __init__(self, cls: type[Any]) -> None:
        self.cls = cls
        self.label = label(cls)
        hints = typing.get_type_hints(cls)
        fields = dataclasses.fields(cls)
        self.names = frozenset(f.name for f in fields)
        self._order = tuple(f.name for f in fields)
        # (name, required, types the check passes unchanged, check)
        self._checks: list[tuple[str, bool, frozenset[type], Check | None]] = []
        for f in fields:
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            hint = hints[f.name]
            check = _checker(hint, f"{self.label}.{f.name}")
            self._checks.append((f.name, required, _passes(hint), check))
        # A map with every field: the fields with a check, their values read and
        # type-tested in C; only those not passed as is go to Python.
        checked = [(name, passes, chk) for name, _, passes, chk in self._checks if chk is not None]
        self._checked = tuple((name, check) for name, _, check in checked)
        self._checked_passes = tuple(passes for _, passes, _ in checked)
        names = [name for name, _, _ in checked]
        self._values: Callable[[dict[str, Any]], tuple[Any, ...]]
        if not names:
            self._values = _no_values
        elif len(names) == 1:  # itemgetter of one name gives the value, not a tuple
            self._values = partial(_one_value, names[0])
        else:
            self._values = operator.itemgetter(*names)

    def build(self, body: dict[str, Any]) -> Any:
        """An instance from ``body`` (a str-keyed map; modified in place)."""
        if not body.keys() <= self.names:
            unknown = sorted(set(body) - self.names)
            raise FieldError(f"{self.label}: unknown field(s) {unknown}")
        if len(body) == len(self._order):  # every field there: none missing
            # The loop below, for the values whose type its check does not pass as is
            # (in field order: the first bad field raises, as there).
            values = self._values(body)
            unchecked = map(not_, map(contains, self._checked_passes, map(type, values)))
            for i in compress(range(len(values)), unchecked):
                name, convert = self._checked[i]
                body[name] = convert(values[i])
            return self.cls(**body)
        for name, required, passes, check in self._checks:
            value = body.get(name, _ABSENT)
            if value is _ABSENT:
                if required:
                    raise FieldError(f"{self.label}: missing field {name!r}")
            # A value of a type its check returns as is skips the call (most fields:
            # ids, counts, flags, absent options); any other goes through the check,
            # which converts it or raises with the field's message.
            elif check is not None and type(value) not in passes:
                body[name] = check(value)
        return self.cls(**body)


_CODECS: dict[type[Any], Codec] = {}


def codec_for(cls: type[Any]) -> Codec:
    codec = _CODECS.get(cls)
    if codec is None:
        codec = _CODECS[cls] = Codec(cls)
    return codec


_ABSENT = object()
_NONE_TYPE = frozenset({type(None)})


def _passes(hint: Any) -> frozenset[type]:
    """The value types ``_checker(hint)`` accepts and returns unchanged without a
    look inside: exact scalars (an int for a float is converted: not here) and
    None where the hint allows it."""
    if hint in _EXACT:
        return frozenset({float}) if hint is float else _EXACT[hint]
    if typing.get_origin(hint) in (Union, types.UnionType):
        args = typing.get_args(hint)
        if type(None) in args:
            others = [a for a in args if a is not type(None)]
            if len(others) == 1 and others[0] in _EXACT:  # X | None: no conversion
                return _EXACT[others[0]] | _NONE_TYPE
            return _NONE_TYPE
    return frozenset()


def _checker(hint: Any, where: str) -> Check | None:
    """A function that checks (and converts) one field's value; None accepts anything."""
    if dataclasses.is_dataclass(hint):
        return _map_checker(codec_for(hint), where)  # type: ignore[arg-type]
    item = _list_item(hint)
    if item is not None and dataclasses.is_dataclass(item):
        each = _map_checker(codec_for(item), where)  # type: ignore[arg-type]

        def rows(value: Any) -> Any:
            if type(value) is not list:
                raise FieldError(f"{where}: expected a list")
            return [each(v) for v in value]

        return rows
    if isinstance(hint, type) and issubclass(hint, StrEnum):
        members = hint._value2member_map_

        def enum(value: Any) -> Any:
            if type(value) is not str or value not in members:
                raise FieldError(f"{where}: unknown value {value!r}")
            return members[value]

        return enum
    if hint is Any:
        return None
    expected = f"{where}: expected {_type_name(hint)}"
    if hint in _EXACT and hint is not float:  # the most common fields: one type test

        def scalar(value: Any, allowed: frozenset[type] = _EXACT[hint]) -> Any:
            if type(value) not in allowed:
                raise FieldError(f"{expected}, got {type(value).__name__}")
            return value

        return scalar
    conforms = _predicate(hint)
    to_float = hint is float

    def plain(value: Any) -> Any:
        if not conforms(value):
            raise FieldError(f"{expected}, got {type(value).__name__}")
        return float(value) if to_float and type(value) is int else value

    return plain


def _map_checker(codec: Codec, where: str) -> Check:
    def nested(value: Any) -> Any:
        if type(value) is not dict or not str_keys(value):
            raise FieldError(f"{where}: expected a map")
        return codec.build(dict(value))

    return nested


_STR_ONLY = frozenset({str})
_DICT_ONLY = frozenset({dict})
_key_types = partial(map, type)  # a dict's key types, lazily


def str_keys(d: dict[Any, Any]) -> bool:
    """Whether every key of ``d`` is a string (msgpack and msgspec may give others)."""
    return _STR_ONLY.issuperset(map(type, d))  # in C: a generator costs more than the map


def _list_item(hint: Any) -> Any:
    return typing.get_args(hint)[0] if typing.get_origin(hint) is list else None


def _predicate(hint: Any) -> Callable[[Any], bool]:
    """Whether a msgpack value fits ``hint`` (compiled once per field)."""
    origin = typing.get_origin(hint)
    if hint is Any:
        return lambda v: True
    if origin in (Union, types.UnionType):
        args = typing.get_args(hint)
        if len(args) == 2 and type(None) in args:  # X | None, the usual union
            ok = _predicate(args[0] if args[1] is type(None) else args[1])
            return lambda v: v is None or ok(v)
        options = [_predicate(a) for a in args]
        return lambda v: any(ok(v) for ok in options)
    if hint is type(None):
        return lambda v: v is None
    if hint in _EXACT:
        allowed = _EXACT[hint]
        return lambda v: type(v) in allowed
    if origin is list:
        (item,) = typing.get_args(hint)
        if item in _EXACT:  # list[int], ...: one pass in C over the item types
            allowed = _EXACT[item]
            return lambda v: type(v) is list and set(map(type, v)) <= allowed
        if typing.get_origin(item) is dict:  # list[dict[str, ...]] (a batch's entries): in C
            return lambda v: (
                type(v) is list
                and _DICT_ONLY.issuperset(map(type, v))
                and all(map(_STR_ONLY.issuperset, map(_key_types, v)))
            )
        each = _predicate(item)
        return lambda v: type(v) is list and all(each(x) for x in v)
    if origin is dict:
        return lambda v: type(v) is dict and _STR_ONLY.issuperset(map(type, v))  # str_keys
    raise TypeError(f"unsupported field type {hint!r}")  # a bug in the message declarations


def _type_name(hint: Any) -> str:
    if typing.get_origin(hint) is not None:  # list[int], str | None, ...
        return str(hint).replace("typing.", "")
    return getattr(hint, "__name__", str(hint))


# ---------------------------------------------------------------- the fast path
class Wire:
    """Every message class's frames checked, built and packed by msgspec, in C.

    For each dataclass a *mirror* Struct is generated once: the same fields and types
    (nested dataclasses as their mirrors), unknown fields forbidden, tagged by the
    class's ``TYPE``; a frame's mirror has the version ``v`` as a required field, a
    batch entry's has none. Decoding a frame is then two passes in C: the tagged
    union of mirrors validates it (every field's type, no unknown or missing field),
    and the class's own decoder builds the dataclass the code base uses (msgspec
    leaves a field at its class default unset on the instance: read fields by
    attribute, not through ``__dict__``). A frame the mirrors refuse raises
    FieldError in msgspec's words, for the hand-written codecs above to name its
    fault in the protocol's. Encoding packs the dataclass as it is
    (nested ones become maps, StrEnums their values) and writes ``v`` and ``type``
    into the map's head.
    """

    def __init__(self, types_by_tag: dict[str, type[Any]], version: int, batch: type[Any]):
        self.version = version
        self._batch = batch
        nested: dict[type[Any], Any] = {}
        tops, entries = [], []
        self._class_of: dict[type[Any], type[Any]] = {}
        for tag, cls in types_by_tag.items():
            # A batch's entries stay packed: each is checked on its own (``entry``).
            raw = {"messages": list[msgspec.Raw]} if cls is batch else None
            top = _mirror(cls, nested, tag=tag, version=True, hints=raw)
            self._class_of[top] = cls
            tops.append(top)
            if cls is not batch:
                entry = _mirror(cls, nested, tag=tag, version=False)
                self._class_of[entry] = cls
                entries.append(entry)
        self._errors = (msgspec.DecodeError, msgspec.ValidationError)
        self._top = msgspec.msgpack.Decoder(Union[tuple(tops)]).decode  # noqa: UP007
        self._entry = msgspec.msgpack.Decoder(Union[tuple(entries)]).decode  # noqa: UP007
        self._build = {
            cls: msgspec.msgpack.Decoder(cls).decode
            for cls in types_by_tag.values()
            if cls is not batch
        }
        self._pack = msgspec.msgpack.Encoder(enc_hook=_plain).encode
        pack = msgspec.msgpack.Encoder().encode
        self._head = {
            cls: pack("v") + pack(version) + pack("type") + pack(tag)
            for tag, cls in types_by_tag.items()
        }
        self._entry_head = {cls: pack("type") + pack(tag) for tag, cls in types_by_tag.items()}

    def decode(self, frame: bytes) -> Any:
        """The message ``frame`` holds (a batch: the class with its entries still
        packed, for ``entry``). Raises FieldError, in msgspec's words, when the frame
        is refused or of another version: the caller's slow path words it."""
        try:
            wire = self._top(frame)
        except self._errors as exc:
            raise FieldError(str(exc)) from None
        if wire.v != self.version:
            raise FieldError(f"protocol version {wire.v!r}")
        cls = self._class_of[type(wire)]
        if cls is self._batch:
            if not all(map(_packs_a_map, wire.messages)):  # as a frame: refused whole
                raise FieldError("batch.messages: expected a list of maps")
            return cls(wire.messages)
        return self._build[cls](frame)

    def entry(self, raw: Any) -> Any:
        """One batch entry's message (raises as ``decode``)."""
        try:
            wire = self._entry(raw)
        except self._errors as exc:
            raise FieldError(str(exc)) from None
        return self._build[self._class_of[type(wire)]](raw)

    def encode(self, msg: Any) -> bytes:
        return _with_head(self._pack(msg), self._head[type(msg)], 2)

    def encode_entry(self, msg: Any) -> bytes:
        return _with_head(self._pack(msg), self._entry_head[type(msg)], 1)


_MAP_HEADS = frozenset(range(0x80, 0x90)) | {0xDE, 0xDF}


def _packs_a_map(raw: Any) -> bool:
    return memoryview(raw)[0] in _MAP_HEADS


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


def _mirror(
    cls: type[Any],
    nested: dict[type[Any], Any],
    tag: str = "",
    version: bool = False,
    hints: dict[str, Any] | None = None,
) -> Any:
    """A Struct with ``cls``'s fields and types for checking frames (never built by
    hand: the defaults of optional fields are placeholders)."""
    if not tag and cls in nested:
        return nested[cls]
    hints = typing.get_type_hints(cls) | (hints or {})
    fields: list[tuple[Any, ...]] = []
    for f in dataclasses.fields(cls):
        hint = _mirror_hint(hints[f.name], nested)
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        fields.append((f.name, hint) if required else (f.name, hint, None))
    if version:
        fields.append(("v", Any))
    options: dict[str, Any] = {"kw_only": True, "forbid_unknown_fields": True}
    if tag:
        options.update(tag_field="type", tag=tag)
    name = f"{'Frame' if version else 'Entry'}{cls.__name__}" if tag else cls.__name__
    mirror = msgspec.defstruct(name, fields, **options)
    if not tag:
        nested[cls] = mirror
    return mirror


def _mirror_hint(hint: Any, nested: dict[type[Any], Any]) -> Any:
    if dataclasses.is_dataclass(hint):
        return _mirror(hint, nested)  # type: ignore[arg-type]
    item = _list_item(hint)
    if item is not None and dataclasses.is_dataclass(item):
        return list[_mirror(item, nested)]  # type: ignore[arg-type,misc]
    return hint
