"""tandem's wire protocol: every message that crosses a socket, in one module.

A frame is one msgpack map: ``{"v": PROTOCOL_VERSION, "type": TAG, **fields}``.
ROUTER sockets prepend the peer identity; nothing outside this module and
``common.transport`` builds or parses raw frames.

Decoding is strict because the router and workers must never crash on input they
did not expect: a frame that is not msgpack, names an unknown type, misses a
required field, carries an unknown field or a value of the wrong type raises
:class:`ProtocolError` with a machine-readable ``code`` and a human message. The
receiver turns that into an :class:`Error` reply (or a log line when there is no
one to reply to). docs/PROTOCOL.md documents every message below.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, Union

import msgpack

PROTOCOL_VERSION = 2  # 2: Ready.weights

# Error codes carried by Error.code (documented in docs/PROTOCOL.md).
BAD_FRAME = "bad_frame"  # not msgpack / not a map / unknown type
BAD_REQUEST = "bad_request"  # well-formed frame, invalid content
VERSION_MISMATCH = "version_mismatch"
PROMPT_TOO_LONG = "prompt_too_long"
NO_WORKERS = "no_workers"
DUPLICATE_REQUEST = "duplicate_request"
WORKER_LOST = "worker_lost"
WORKER_ERROR = "worker_error"  # the backend failed while running the request
INTERNAL = "internal"  # the router hit a bug handling the request
OVERLOADED = "overloaded"


class ProtocolError(ValueError):
    """A frame could not be accepted. ``request_id`` is set when it could be read."""

    def __init__(self, code: str, message: str, request_id: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.request_id = request_id


@dataclass
class Message:
    """Base class: subclasses set TYPE and declare their fields with types."""

    TYPE: ClassVar[str] = ""


# ---------------------------------------------------------------- handshake
@dataclass
class Hello(Message):
    """Client -> router on connect; the router answers Welcome or Error."""

    TYPE: ClassVar[str] = "hello"
    name: str = ""


@dataclass
class Welcome(Message):
    """Router -> client (answering Hello) or -> worker (acknowledging Ready)."""

    TYPE: ClassVar[str] = "welcome"
    router: str = "tandem"
    policy: str = ""


# ---------------------------------------------------------------- client -> router
@dataclass
class Submit(Message):
    """A generation request. Exactly one of prompt / tokens / messages is set.

    ``worker`` pins the request to a worker selector (id or device label);
    ``prefill_only`` computes the prompt into the worker's prefix cache and
    produces no tokens (used to seed caches).
    """

    TYPE: ClassVar[str] = "submit"
    request_id: str
    prompt: str | None = None
    tokens: list[int] | None = None
    messages: list[dict[str, Any]] | None = None
    max_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    stream: bool = True
    worker: str | None = None
    prefill_only: bool = False


@dataclass
class Cancel(Message):
    """Client -> router, router -> worker. Idempotent: unknown ids are ignored."""

    TYPE: ClassVar[str] = "cancel"
    request_id: str


@dataclass
class StatusQuery(Message):
    TYPE: ClassVar[str] = "status"


@dataclass
class StatusReply(Message):
    """Router -> client: the registry as the router sees it (one dict per worker)."""

    TYPE: ClassVar[str] = "status_reply"
    policy: str
    workers: list[dict[str, Any]]
    requests_in_flight: int = 0
    requests_pending: int = 0  # waiting for a worker (none yet, or theirs was lost)


# ---------------------------------------------------------------- router -> client
@dataclass
class Accepted(Message):
    TYPE: ClassVar[str] = "accepted"
    request_id: str
    worker_id: str
    prompt_tokens: int
    cached_tokens: int = 0


@dataclass
class TokenDelta(Message):
    """Worker -> router -> client: newly generated token ids and their text."""

    TYPE: ClassVar[str] = "tokens"
    request_id: str
    token_ids: list[int]
    text: str


@dataclass
class Done(Message):
    """End of a request's stream. ``stats`` keys: see docs/PROTOCOL.md."""

    TYPE: ClassVar[str] = "done"
    request_id: str
    finish_reason: str  # "stop" | "length" | "eos" | "cancelled" | "prefill_only"
    stats: dict[str, Any] = field(default_factory=dict)


@dataclass
class Error(Message):
    TYPE: ClassVar[str] = "error"
    code: str
    message: str
    request_id: str | None = None


# ---------------------------------------------------------------- worker <-> router
@dataclass
class Ready(Message):
    """Worker -> router on connect (and again when asked to re-register)."""

    TYPE: ClassVar[str] = "ready"
    worker_id: str
    backend: str
    device: str
    model: str
    max_active: int
    n_ctx: int
    block_size: int
    prefill_tok_s: float
    decode_tok_s: list[float]  # aggregate decode tok/s at batch size 1, 2, ... max_active
    heartbeat_s: float
    tokenizer: dict[str, Any]  # common.tokenizer.TokenizerSpec.to_wire()
    max_tokens_limit: int = 4096
    instance: str = ""  # random per process start: tells a restart from a repeated Ready
    weights: str = ""  # digest of the weights (common.gguf_file.weights_digest); "" unknown


@dataclass
class Heartbeat(Message):
    """Worker -> router, on a period and at once when its queue or cache changes.

    ``active`` / ``queued``: one dict per request: ``id``, ``prompt``,
    ``cached``, ``prefill_remaining``, ``decode_remaining``.
    ``cache``: prefix-block changes, see common.blocks.CacheLog.
    """

    TYPE: ClassVar[str] = "heartbeat"
    worker_id: str
    seq: int
    active: list[dict[str, Any]]
    queued: list[dict[str, Any]]
    kv_used_tokens: int
    kv_capacity_tokens: int
    cache: dict[str, Any]


@dataclass
class Assign(Message):
    """Router -> worker: a whole request, already tokenized."""

    TYPE: ClassVar[str] = "assign"
    request_id: str
    tokens: list[int]
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    prefill_only: bool = False
    cached_estimate: int = 0  # what the router believed this worker had cached


@dataclass
class Reregister(Message):
    """Router -> worker: "I do not know you" (e.g. the router restarted): send Ready."""

    TYPE: ClassVar[str] = "reregister"


@dataclass
class ResyncCache(Message):
    """Router -> worker: a cache delta did not apply; send the full block set next."""

    TYPE: ClassVar[str] = "resync_cache"


@dataclass
class Goodbye(Message):
    """Worker -> router on clean shutdown; its in-flight requests are re-routed or failed."""

    TYPE: ClassVar[str] = "goodbye"
    worker_id: str


MESSAGE_TYPES: dict[str, type[Message]] = {
    cls.TYPE: cls
    for cls in (
        Hello,
        Welcome,
        Submit,
        Cancel,
        StatusQuery,
        StatusReply,
        Accepted,
        TokenDelta,
        Done,
        Error,
        Ready,
        Heartbeat,
        Assign,
        Reregister,
        ResyncCache,
        Goodbye,
    )
}


# ---------------------------------------------------------------- encoding
def encode(msg: Message) -> bytes:
    body = dataclasses.asdict(msg)
    body["v"] = PROTOCOL_VERSION
    body["type"] = msg.TYPE
    return msgpack.packb(body, use_bin_type=True)


def decode(frame: bytes) -> Message:
    """Parse and validate one frame; raise ProtocolError on anything unexpected."""
    try:
        body = msgpack.unpackb(frame, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types
        raise ProtocolError(BAD_FRAME, f"frame is not valid msgpack: {exc}") from None
    if not isinstance(body, dict):
        raise ProtocolError(BAD_FRAME, "frame must be a msgpack map")
    if not all(isinstance(k, str) for k in body):
        raise ProtocolError(BAD_FRAME, "frame keys must be strings")
    rid = body.get("request_id") if isinstance(body.get("request_id"), str) else None
    version = body.pop("v", None)
    if version != PROTOCOL_VERSION:
        raise ProtocolError(
            VERSION_MISMATCH,
            f"protocol version {version!r} is not supported (this peer speaks "
            f"{PROTOCOL_VERSION}); upgrade the older side",
            rid,
        )
    tag = body.pop("type", None)
    cls = MESSAGE_TYPES.get(tag) if isinstance(tag, str) else None
    if cls is None:
        raise ProtocolError(BAD_FRAME, f"unknown message type {tag!r}", rid)
    return _build(cls, body, rid)


def _build(cls: type[Message], body: dict[str, Any], rid: str | None) -> Message:
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(body) - set(fields))
    if unknown:
        raise ProtocolError(BAD_REQUEST, f"{cls.TYPE}: unknown field(s) {unknown}", rid)
    for name, f in fields.items():
        if name not in body:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ProtocolError(BAD_REQUEST, f"{cls.TYPE}: missing field {name!r}", rid)
            continue
        if not _conforms(body[name], hints[name]):
            raise ProtocolError(
                BAD_REQUEST,
                f"{cls.TYPE}.{name}: expected {_type_name(hints[name])}, "
                f"got {type(body[name]).__name__}",
                rid,
            )
        if hints[name] is float and isinstance(body[name], int):
            body[name] = float(body[name])
    return cls(**body)


def _conforms(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if hint is Any:
        return True
    if origin in (Union, types.UnionType):
        return any(_conforms(value, arg) for arg in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if origin is list:
        (item,) = typing.get_args(hint)
        return isinstance(value, list) and all(_conforms(v, item) for v in value)
    if origin is dict:
        return isinstance(value, dict) and all(isinstance(k, str) for k in value)
    raise TypeError(f"unsupported field type {hint!r}")  # a bug in this module


def _type_name(hint: Any) -> str:
    if typing.get_origin(hint) is not None:  # list[int], str | None, ...
        return str(hint).replace("typing.", "")
    return getattr(hint, "__name__", str(hint))
