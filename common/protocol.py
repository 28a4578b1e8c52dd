"""tandem's wire protocol: every message that crosses a socket, in one module.

A frame is one msgpack map: ``{"v": PROTOCOL_VERSION, "type": TAG, **fields}``,
or a ``batch`` of such maps (without ``v``) for one peer, which ``decode_all``
unpacks. ROUTER sockets prepend the peer identity; nothing outside this module
and ``common.transport`` builds or parses raw frames.

Decoding is strict because the router and workers must never crash on input they
did not expect: a frame that is not msgpack, names an unknown type, misses a
required field, carries an unknown field or a value of the wrong type raises
:class:`ProtocolError` with a machine-readable ``code`` and a human message. The
receiver turns that into an :class:`Error` reply (or a log line when there is no
one to reply to). docs/PROTOCOL.md documents every message below.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar, NoReturn

import msgpack

from tandem.common.codec import FieldError, Wire, codec_for, str_keys
from tandem.common.errors import ErrorCode, Problem
from tandem.common.framescan import MAX_FRAME_DEPTH, scan
from tandem.common.validation import message_problem

PROTOCOL_VERSION = 6  # 2: SamplingParams, enums, rows; 3: tokenizer hash, step model, bounds;
# 4: step_tokens (a worker that batches its deltas must not meet a router that cannot read them);
# 5: batch (the router sends a peer what one turn owes it in one frame); 6: ready.provisional


class FinishReason(StrEnum):
    """Why a request's stream ended (``Done.finish_reason``)."""

    STOP = "stop"  # a stop string matched
    LENGTH = "length"  # max_tokens produced
    EOS = "eos"  # the model produced an end-of-generation token
    CANCELLED = "cancelled"
    PREFILL_ONLY = "prefill_only"  # the prompt was cached, nothing generated


# Module-level names for the codes, as the rest of the code base spells them.
BAD_FRAME, BAD_REQUEST = ErrorCode.BAD_FRAME, ErrorCode.BAD_REQUEST
VERSION_MISMATCH, PROMPT_TOO_LONG = ErrorCode.VERSION_MISMATCH, ErrorCode.PROMPT_TOO_LONG
NO_WORKERS, DUPLICATE_REQUEST = ErrorCode.NO_WORKERS, ErrorCode.DUPLICATE_REQUEST
WORKER_LOST, WORKER_ERROR = ErrorCode.WORKER_LOST, ErrorCode.WORKER_ERROR
INTERNAL, OVERLOADED = ErrorCode.INTERNAL, ErrorCode.OVERLOADED
ROUTER_LOST = ErrorCode.ROUTER_LOST

MAX_STOP_STRINGS = 16


class Refusal(StrEnum):
    """Why a frame was refused, in a small fixed set: the ``reason`` label of the
    router's ``tandem_frames_rejected_total`` (docs/METRICS.md)."""

    TOO_DEEP = "too_deep"  # nested past framescan.MAX_FRAME_DEPTH: refused before decoding
    TOO_LARGE = "too_large"  # a header claims more items or bytes than the frame holds
    MALFORMED = "malformed"  # not msgpack, not a map, an unknown type
    BAD_FIELD = "bad_field"  # a field missing, unknown, mistyped or out of bounds
    VERSION = "version"  # another protocol version
    UNREADABLE = "unreadable"  # the decoder itself failed on it (any other exception)


_REASON_OF_CODE = {BAD_FRAME: Refusal.MALFORMED, VERSION_MISMATCH: Refusal.VERSION}


class ProtocolError(ValueError):
    """A frame could not be accepted. ``request_id`` is set when it could be read;
    ``reason`` says which kind of refusal it is (by default, from ``code``)."""

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        request_id: str | None = None,
        reason: Refusal | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.request_id = request_id
        self.reason = reason or _REASON_OF_CODE.get(code, Refusal.BAD_FIELD)


@dataclass
class Message:
    """Base class: subclasses set TYPE and declare their fields with types."""

    TYPE: ClassVar[str] = ""


# ---------------------------------------------------------------- domain types
@dataclass(frozen=True)
class SamplingParams:
    """How one request generates: carried by Submit, Assign and the worker's Request.

    ``max_tokens`` is the decode budget; ``prefill_only`` computes the prompt into
    the worker's prefix cache and produces nothing (used to seed caches).
    """

    max_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    prefill_only: bool = False

    @property
    def budget(self) -> int:
        """Output tokens this request may produce (0 when it only fills the cache)."""
        return 0 if self.prefill_only else self.max_tokens

    def problem(self, max_tokens_limit: int | None = None) -> Problem | None:
        """What makes these parameters unusable, or None."""
        if not self.prefill_only and self.max_tokens < 1:
            return Problem.bad_request("max_tokens must be >= 1")
        if max_tokens_limit is not None and self.max_tokens > max_tokens_limit:
            return Problem.bad_request(f"max_tokens must be <= {max_tokens_limit}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            return Problem.bad_request("temperature must be a finite number >= 0")
        if not math.isfinite(self.top_p) or not 0 < self.top_p <= 1:
            return Problem.bad_request("top_p must be in (0, 1]")
        if self.top_k < 0:
            return Problem.bad_request("top_k must be >= 0")
        if self.seed is not None and not 0 <= self.seed < 2**64:
            return Problem.bad_request("seed must be in [0, 2**64)")
        if len(self.stop) > MAX_STOP_STRINGS:
            return Problem.bad_request(f"at most {MAX_STOP_STRINGS} stop strings")
        if any(not s for s in self.stop):
            return Problem.bad_request("stop strings must be non-empty")
        return None


@dataclass(frozen=True)
class RequestRow:
    """One request as a worker's heartbeat lists it (active or queued)."""

    id: str
    prompt: int  # prompt tokens
    cached: int  # of which reused from the prefix cache
    prefill_remaining: int
    decode_remaining: int


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
    epoch: str = ""  # random per router start (broker/identity.py)


# ---------------------------------------------------------------- client -> router
@dataclass
class Submit(Message):
    """A generation request. Exactly one of prompt / tokens / messages is set.

    ``worker`` pins the request to a worker selector (id or device label).
    """

    TYPE: ClassVar[str] = "submit"
    request_id: str
    prompt: str | None = None
    tokens: list[int] | None = None
    messages: list[dict[str, Any]] | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stream: bool = True
    worker: str | None = None


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
    activity: dict[str, Any] = field(default_factory=dict)  # totals, recent decisions


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
class StepTokens(Message):
    """Worker -> router: the token deltas of several requests in one frame, as a
    worker's I/O thread found them waiting together (one engine step's, usually):
    entry i is ``TokenDelta(request_ids[i], token_ids[i], texts[i])``. The router
    relays each to its client as that TokenDelta; clients never see this frame."""

    TYPE: ClassVar[str] = "step_tokens"
    request_ids: list[str]
    token_ids: list[list[int]]
    texts: list[str]

    def deltas(self) -> list[TokenDelta]:
        return [
            TokenDelta(r, t, x)
            for r, t, x in zip(self.request_ids, self.token_ids, self.texts, strict=True)
        ]


@dataclass
class Done(Message):
    """End of a request's stream. ``stats`` keys: see docs/PROTOCOL.md."""

    TYPE: ClassVar[str] = "done"
    request_id: str
    finish_reason: FinishReason
    stats: dict[str, Any] = field(default_factory=dict)


@dataclass
class Error(Message):
    TYPE: ClassVar[str] = "error"
    code: ErrorCode
    message: str
    request_id: str | None = None
    retry_after_s: float | None = None  # with OVERLOADED: when trying again may succeed


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
    # common.tokenizer.TokenizerSpec.to_wire(), or {} when only the hash is sent: a
    # router that already has that tokenizer needs no 1.5 MB spec per worker.
    tokenizer: dict[str, Any]
    max_tokens_limit: int = 4096
    instance: str = ""  # random per process start: tells a restart from a repeated Ready
    tokenizer_hash: str = ""  # tokenizer_hash(spec); "" = not given (the spec must be)
    step_tokens: int = 256  # the engine's per-step token budget (finish-time prediction)
    weights: str = ""  # digest of the weights (common.gguf_file.weights_digest); "" unknown
    # Rates not yet borne out by steps served here (a stored profile, a quick start-up
    # measurement): the router trusts them less until its live step model has enough.
    provisional: bool = False


def tokenizer_hash(spec: dict[str, Any]) -> str:
    """A stable name for a tokenizer spec: equal specs, equal hashes, on any peer."""
    text = json.dumps(spec, sort_keys=True, ensure_ascii=False, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass
class Heartbeat(Message):
    """Worker -> router, on a period and at once when its queue or cache changes.

    ``active`` / ``queued``: one RequestRow per request.
    ``cache``: prefix-block changes, see common.blocks.CacheLog.
    ``steps``: the worker's measured step costs (``common.steptime.StepModel``
    wire form), only when they changed (at most every ``steps_every_s``) or on
    a resync; None otherwise, and the router keeps the last one it got.
    """

    TYPE: ClassVar[str] = "heartbeat"
    worker_id: str
    seq: int
    active: list[RequestRow]
    queued: list[RequestRow]
    kv_used_tokens: int
    kv_capacity_tokens: int
    cache: dict[str, Any]
    steps: dict[str, Any] | None = None


@dataclass
class Assign(Message):
    """Router -> worker: a whole request, already tokenized."""

    TYPE: ClassVar[str] = "assign"
    request_id: str
    tokens: list[int]
    sampling: SamplingParams
    resume: int = 0  # a migrated stream: the last ``resume`` tokens were already output


@dataclass
class Reregister(Message):
    """Router -> worker: "I do not know you" (e.g. the router restarted): send Ready.

    ``tokenizer``: the router lacks the tokenizer a hash-only Ready named: send the
    Ready again with the full spec.
    """

    TYPE: ClassVar[str] = "reregister"
    tokenizer: bool = False


@dataclass
class ResyncCache(Message):
    """Router -> worker: a cache delta did not apply; send the full block set next."""

    TYPE: ClassVar[str] = "resync_cache"


@dataclass
class Batch(Message):
    """Several messages for one peer in one frame, in order; each entry is a message's
    map without ``v`` (the frame's covers it). The router sends a client or worker
    what one pass of its loop owes it (Accepteds, tokens, Dones; Assigns); a worker's
    I/O thread sends the router what it finds waiting together (a step's tokens and
    Dones). The router's cost is per frame, not per message
    (docs/results/router-overhead.md). Receivers read it with ``decode_all`` /
    ``entries`` (or ``DealerSocket.recv``) as if every entry had come in its own
    frame; clients never send one."""

    TYPE: ClassVar[str] = "batch"
    messages: list[dict[str, Any]]


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
        StepTokens,
        Done,
        Error,
        Ready,
        Heartbeat,
        Assign,
        Reregister,
        ResyncCache,
        Goodbye,
        Batch,
    )
}


# ---------------------------------------------------------------- encoding
# Each class is compiled once, here at import (common/codec.py says how and why).
_CODECS = {cls: codec_for(cls) for cls in MESSAGE_TYPES.values()}

# The fast path (common/codec.py, ``Wire``): msgspec checks and builds every frame in C;
# the hand-written codecs above only word the error of a frame it refuses.
_WIRE = Wire(MESSAGE_TYPES, PROTOCOL_VERSION, batch=Batch)


def encode(msg: Message) -> bytes:
    return _WIRE.encode(msg)


def encode_batch(msgs: Sequence[Message]) -> bytes:
    """One ``batch`` frame holding ``msgs`` in order (``decode_all`` reads it back)."""
    return _BATCH_HEAD + _array_header(len(msgs)) + b"".join(map(batch_entry, msgs))


def batch_entry(msg: Message) -> bytes:
    """``msg`` packed as one entry of a batch: its map with ``type`` and without ``v``.
    ``encode_batch`` joins them; a sender that bounds its frames by size packs them
    one by one and joins them with ``join_batch``."""
    return _WIRE.encode_entry(msg)


def join_batch(entries: Sequence[bytes]) -> bytes:
    """A ``batch`` frame from entries packed by ``batch_entry`` (no re-encoding)."""
    return _BATCH_HEAD + _array_header(len(entries)) + b"".join(entries)


def _array_header(n: int) -> bytes:
    if n < 16:
        return bytes((0x90 | n,))
    return b"\xdc" + n.to_bytes(2, "big") if n < 1 << 16 else b"\xdd" + n.to_bytes(4, "big")


# {"v": V, "type": "batch", "messages": <array>}: the array's header and entries follow.
_BATCH_HEAD = msgpack.packb({"v": PROTOCOL_VERSION, "type": Batch.TYPE}, use_bin_type=True)
_BATCH_HEAD = bytes((_BATCH_HEAD[0] + 1,)) + _BATCH_HEAD[1:] + msgpack.packb("messages")


def decode(frame: bytes) -> Message:
    """Parse and validate one frame; raise ProtocolError on anything unexpected, and
    nothing else, whatever the bytes (the boundary every received frame crosses).
    A ``batch`` frame comes back as a Batch of packed entries (see ``decode_all``)."""
    try:
        # Nesting is bounded before any decoder recurses into the frame (a ~1 KB frame
        # nested 1,000 deep made msgspec raise RecursionError): common/framescan.py.
        deep = scan(frame) if len(frame) > MAX_FRAME_DEPTH else None
        if deep is not None:
            raise _scan_refusal(deep)
        try:
            msg = _WIRE.decode(frame)
        except FieldError as refused:  # the hand-written codecs say why
            _refused(refused, _decode_slow, frame)
        _check(msg)
        return msg
    except ProtocolError:
        raise
    except Exception as exc:  # a peer's bytes must never raise anything else
        raise _unreadable(exc) from None


def _scan_refusal(deep: str) -> ProtocolError:
    if deep == Refusal.TOO_DEEP:
        what = f"frame nests deeper than {MAX_FRAME_DEPTH} levels"
    else:
        what = "frame declares a length past its end"
    return ProtocolError(BAD_FRAME, what, reason=Refusal(deep))


def _unreadable(exc: BaseException) -> ProtocolError:
    return ProtocolError(
        BAD_FRAME, f"frame could not be decoded ({type(exc).__name__})", reason=Refusal.UNREADABLE
    )


def _refused(refused: FieldError, explain: Any, frame: Any) -> NoReturn:
    """Raise the ProtocolError that ``explain(frame)`` (the hand-written path) raises
    for a frame the fast path refused; if it finds nothing wrong, msgspec's reason."""
    raise ProtocolError(BAD_REQUEST, str(refused), _request_id(explain(frame)))


def _check(msg: Message) -> None:
    """Values within bounds (common/validation.py); a batch's entries are checked one
    by one when it is unpacked, so its own check is only on their number."""
    problem = message_problem(msg)
    if problem is not None:
        raise ProtocolError(problem.code, problem.message, _request_id(msg))


def _request_id(msg: Message) -> str | None:
    rid = getattr(msg, "request_id", None)
    return rid if type(rid) is str else None


def _decode_slow(frame: bytes) -> Message:
    try:
        body = msgpack.unpackb(frame, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types
        raise ProtocolError(BAD_FRAME, f"frame is not valid msgpack: {exc}") from None
    if type(body) is not dict:
        raise ProtocolError(BAD_FRAME, "frame must be a msgpack map")
    if not str_keys(body):  # msgpack may also give bytes keys
        raise ProtocolError(BAD_FRAME, "frame keys must be strings")
    rid = body.get("request_id")
    if type(rid) is not str:
        rid = None
    version = body.pop("v", None)
    if version != PROTOCOL_VERSION:
        raise ProtocolError(
            VERSION_MISMATCH,
            f"protocol version {version!r} is not supported (this peer speaks "
            f"{PROTOCOL_VERSION}); upgrade the older side",
            rid,
        )
    return _build(body, rid)


def decode_all(frame: bytes) -> list[Message | ProtocolError]:
    """Every message in ``frame``: the one it holds, or a batch's entries in order,
    each checked exactly as if it had come in its own frame (a bad entry is a
    ProtocolError in its place; the others still count). Raises ProtocolError when
    the frame itself cannot be read."""
    msg = decode(frame)
    return entries(msg) if type(msg) is Batch else [msg]


def entries(batch: Batch) -> list[Message | ProtocolError]:
    """A decoded batch's messages, as ``decode_all`` gives them."""
    out: list[Message | ProtocolError] = []
    for raw in batch.messages:  # the batch's frame was scanned whole (decode)
        try:
            try:
                msg = _WIRE.entry(raw)
            except FieldError as refused:  # the hand-written codecs say why
                _refused(refused, _entry_slow, raw)
            _check(msg)
            out.append(msg)
        except ProtocolError as exc:
            out.append(exc)
        except Exception as exc:  # as in decode: nothing else leaves a peer's bytes
            out.append(_unreadable(exc))
    return out


def _entry_slow(raw: Any) -> Message:
    try:
        body = msgpack.unpackb(raw, raw=False, strict_map_key=True)
    except Exception as exc:
        raise ProtocolError(BAD_FRAME, f"batch entry is not valid msgpack: {exc}") from None
    if type(body) is not dict or not str_keys(body):
        raise ProtocolError(BAD_FRAME, "a batch entry must be a map with string keys")
    rid = body.get("request_id")
    return _build(body, rid if type(rid) is str else None, in_batch=True)


def _build(body: dict[str, Any], rid: str | None, in_batch: bool = False) -> Message:
    """The message a version-checked map holds (its ``type`` popped), validated."""
    tag = body.pop("type", None)
    cls = MESSAGE_TYPES.get(tag) if type(tag) is str else None
    if cls is None or (in_batch and cls is Batch):
        where = " in a batch" if in_batch else ""
        raise ProtocolError(BAD_FRAME, f"unknown message type {tag!r}{where}", rid)
    try:
        msg = _CODECS[cls].build(body)
    except FieldError as exc:
        raise ProtocolError(BAD_REQUEST, str(exc), rid) from None
    _check(msg)
    return msg
