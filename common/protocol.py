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
from collections.abc import Sequence
from enum import StrEnum
from typing import Annotated, Any, ClassVar

import msgspec
from msgspec import Meta

from tandem.common import validation as bounds
from tandem.common.codec import DECODE_ERRORS, Wire
from tandem.common.errors import ErrorCode, Problem
from tandem.common.framescan import MAX_FRAME_DEPTH, scan
from tandem.common.schema_keywords import beyond_core
from tandem.common.validation import (
    Count,
    Id,
    Label,
    NodeName,
    Rate,
    Ref,
    Seconds,
    Text,
    TokenId,
    Tokens,
    message_problem,
)

PROTOCOL_VERSION = 13  # 2: SamplingParams, enums, rows; 3: tokenizer hash, step model, bounds;
# 4: step_tokens (a worker that batches its deltas must not meet a router that cannot read them);
# 5: batch (the router sends a peer what one turn owes it in one frame); 6: ready.provisional;
# 7: msgspec Structs (fields at their default left out, ``type`` first, ids without control
# characters); 8: sampling's penalties, logit_bias, min_p, logprobs, json_schema, token
# logprobs, ready.capabilities (a request that needs one must not reach a worker that drops it);
# 9: heartbeat.cache, .steps and done.stats typed (their fields at their default left out);
# 10: starting (a worker announces itself while it loads), status_reply.starting
# 11: heartbeat.cache.tiers (the prefix cache's sizes by tier); 12: ready.node (the machine)
# 13: ready.decode_steps (a router that smooths a measured step down prices 9 rows as 8)


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

MAX_STOP_STRINGS = bounds.MAX_STOP_STRINGS


class Refusal(StrEnum):
    """Why a frame was refused, in a small fixed set: the ``reason`` label of the
    router's ``tandem_frames_rejected_total`` (docs/METRICS.md)."""

    TOO_DEEP = "too_deep"  # nested past framescan.MAX_FRAME_DEPTH: refused before decoding
    TOO_LARGE = "too_large"  # a header claims more items or bytes than the frame holds
    MALFORMED = "malformed"  # not msgpack, not a map, an unknown type
    BAD_FIELD = "bad_field"  # a field missing, unknown, mistyped or out of bounds
    VERSION = "version"  # another protocol version
    UNREADABLE = "unreadable"  # the decoder itself failed on it (any other exception)
    OVER_CAPACITY = "over_capacity"  # a cache report listing more than the worker can hold


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
        field: str | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.request_id = request_id
        self.reason = reason or _REASON_OF_CODE.get(code, Refusal.BAD_FIELD)
        self.field = field  # the refused field's path ("sampling.top_p"), when one is


class Message(
    msgspec.Struct, tag_field="type", forbid_unknown_fields=True, omit_defaults=True, kw_only=True
):
    """Base class: a subclass declares its fields with their types and bounds and its
    tag (``class Cancel(Message, tag="cancel")``; ``TYPE`` is set from it). Fields at
    their default are not sent (``omit_defaults``). ``v`` is the frame's protocol
    version, read and checked by ``decode``; a message in memory has None there."""

    TYPE: ClassVar[str] = ""
    v: int | None = None


class Struct(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """A value nested in messages (``SamplingParams``, ``RequestRow``): checked
    field by field exactly like a message, unknown fields refused."""


class Capability(StrEnum):
    """What a worker serves beyond plain sampling (``Ready.capabilities``). A request
    needs the ones ``SamplingParams.needs`` names; the router sends it only to a
    worker that has them all (broker/capabilities.py)."""

    PENALTIES = "penalties"  # presence / frequency / repetition penalty
    LOGIT_BIAS = "logit_bias"
    MIN_P = "min_p"
    LOGPROBS = "logprobs"
    JSON_SCHEMA = "json_schema"  # output constrained to a JSON Schema
    # ... also by the keywords beyond the core (numeric bounds, multipleOf, property
    # counts, patternProperties, formats: common/schema_keywords.py)
    JSON_SCHEMA_FULL = "json_schema_full"


# ---------------------------------------------------------------- domain types
StopString = Annotated[str, Meta(min_length=1, max_length=bounds.MAX_TEXT_CHARS)]
Penalty = Annotated[float, Meta(ge=-2, le=2)]  # OpenAI's presence / frequency penalty
Bias = Annotated[float, Meta(ge=-100, le=100)]  # OpenAI's logit_bias values
SchemaText = Annotated[str, Meta(min_length=1, max_length=bounds.MAX_SCHEMA_CHARS)]
# A natural-log probability: finite or -inf (a token the model rules out); NaN and +inf
# are refused.
Logprob = Annotated[float, Meta(le=bounds.MAX_FLOAT)]


class SamplingParams(Struct, frozen=True):
    """How one request generates: carried by Submit, Assign and the worker's Request.

    ``max_tokens`` is the decode budget; ``prefill_only`` computes the prompt into
    the worker's prefix cache and produces nothing (used to seed caches).

    A field's range is part of its type, checked as a frame is decoded (the
    router's door for a Submit); ``problem`` holds the rules across fields. To
    add a parameter: a field here with its bounds, a rule in ``problem`` if it
    depends on another, a row in docs/PROTOCOL.md.
    """

    max_tokens: Annotated[int, Meta(ge=0, le=bounds.MAX_N_CTX)] = 128
    temperature: Annotated[float, Meta(ge=0, le=bounds.MAX_FLOAT)] = 0.0
    top_p: Annotated[float, Meta(gt=0, le=1)] = 1.0
    top_k: Annotated[int, Meta(ge=0, le=bounds.MAX_TOKEN_ID)] = 0
    seed: Annotated[int, Meta(ge=0)] | None = None  # < 2**64: all msgpack carries
    stop: Annotated[list[StopString], Meta(max_length=MAX_STOP_STRINGS)] = []
    ignore_eos: bool = False
    prefill_only: bool = False
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    repetition_penalty: Annotated[float, Meta(gt=0, le=10)] = 1.0  # llama.cpp / HF; 1: off
    min_p: Annotated[float, Meta(ge=0, le=1)] = 0.0
    # token id -> bias added to its logit (a msgpack map with int keys).
    logit_bias: Annotated[dict[TokenId, Bias], Meta(max_length=bounds.MAX_LOGIT_BIAS)] = {}
    # None: no logprobs; n: each output token's logprob and the n likeliest (TokenLogprob).
    logprobs: Annotated[int, Meta(ge=0, le=bounds.MAX_LOGPROBS)] | None = None
    # The JSON text of a JSON Schema (an object, or true) the output must match.
    json_schema: SchemaText | None = None
    # End-of-generation tokens are not sampled before this many output tokens (vLLM's
    # extension); stop strings still end the output.
    min_tokens: Annotated[int, Meta(ge=0, le=bounds.MAX_N_CTX)] = 0

    def needs(self) -> frozenset[str]:
        """The capabilities a worker needs to serve these parameters (``Capability``)."""
        needs = []
        if self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0:
            needs.append(Capability.PENALTIES)
        if self.logit_bias:
            needs.append(Capability.LOGIT_BIAS)
        if self.min_p > 0:
            needs.append(Capability.MIN_P)
        if self.logprobs is not None:
            needs.append(Capability.LOGPROBS)
        if self.json_schema is not None:
            needs.append(Capability.JSON_SCHEMA)
            if beyond_core(self.json_schema):
                needs.append(Capability.JSON_SCHEMA_FULL)
        return frozenset(needs)

    @property
    def budget(self) -> int:
        """Output tokens this request may produce (0 when it only fills the cache)."""
        return 0 if self.prefill_only else self.max_tokens

    def over_limit(self, max_tokens_limit: int) -> Problem | None:
        """A worker's own check: an output budget outside 1..its ``max_tokens_limit``
        (0 with ``prefill_only``), or None. The rest (the schema's JSON included) was
        checked once, at the router's door."""
        low = 0 if self.prefill_only else 1
        if not low <= self.max_tokens <= max_tokens_limit:
            words = f"max_tokens must be in {low}..{max_tokens_limit}"
            return Problem.bad_request(words, "sampling.max_tokens")
        return None

    def problem(self, max_tokens_limit: int | None = None) -> Problem | None:
        """What breaks a rule across fields (or a ``max_tokens_limit``), or None: the
        router's door. The ranges of single fields are their types' (checked on
        decoding)."""
        if not self.prefill_only and self.max_tokens < 1:
            return Problem.bad_request("max_tokens must be >= 1", "sampling.max_tokens")
        if self.min_tokens > self.max_tokens and not self.prefill_only:
            words = f"min_tokens ({self.min_tokens}) must be <= max_tokens ({self.max_tokens})"
            return Problem.bad_request(words, "sampling.min_tokens")
        if max_tokens_limit is not None and self.max_tokens > max_tokens_limit:
            words = f"max_tokens must be <= {max_tokens_limit}"
            return Problem.bad_request(words, "sampling.max_tokens")
        if self.json_schema is not None:
            return bounds.schema_problem(self.json_schema)
        return None


class TokenLogprob(Struct, frozen=True):
    """One output token's logprob (``SamplingParams.logprobs``): the model's
    log-softmax after logit_bias and penalties, before temperature and truncation.
    ``token`` is its text piece (decoded with errors="replace"); ``top`` the n
    likeliest as (id, piece, logprob), most likely first."""

    id: TokenId
    token: Text
    logprob: Logprob
    top: Annotated[list[tuple[TokenId, Text, Logprob]], Meta(max_length=bounds.MAX_LOGPROBS)] = []


BlockHash = Annotated[int, Meta(ge=0)]  # 63-bit chained block hashes (common/blocks.py)
# A listing or delta of them: at most what any worker's listing may hold.
BlockHashes = Annotated[list[BlockHash], Meta(max_length=bounds.MAX_CACHE_BLOCKS)]


class CacheTiers(Struct, frozen=True):
    """A worker's prefix cache by tier (workers/prefix_cache.py), in tokens: held and
    capacity on the device and in host RAM, and the KV bytes of one token (0:
    unknown). What ``tandem status``, ``top`` and the metrics show."""

    cache_tokens: Count = 0
    cache_capacity_tokens: Count = 0
    host_cache_tokens: Count = 0
    host_cache_capacity_tokens: Count = 0
    kv_bytes_per_token: Count = 0


class CacheReport(Struct, frozen=True):
    """A worker's prefix blocks (common/blocks.py: ``CacheLog`` writes it, ``CacheView``
    reads it): a full listing (``full``, every block held in ``blocks``), or the
    changes since report ``base`` (``added``, ``removed``; ``seq == base + 1``, or
    ``seq == base`` with empty lists when nothing changed). A worker with a host-RAM
    tier adds its device tier's own report (``device``) and how fast it restores
    from host RAM (``restore_tok_s``; 0: not measured yet). Every report of a worker
    that sizes its cache carries the sizes of its tiers (``tiers``)."""

    full: bool
    seq: Count
    blocks: BlockHashes = []
    base: Count = 0
    added: BlockHashes = []
    removed: BlockHashes = []
    device: CacheReport | None = None
    restore_tok_s: Annotated[float, Meta(ge=0, le=bounds.MAX_FLOAT)] = 0.0
    tiers: CacheTiers | None = None


_STEP_KEYS = {"decode_batch": "b", "decode_step_s": "s", "decode_samples": "n",
              "context": "ctx", "context_s": "k", "prefill_chunk": "p",
              "prefill_tok_s": "pr", "prefill_samples": "pn"}  # fmt: skip
_Series = Meta(max_length=bounds.STEP_POINTS)
_Sizes = Annotated[list[Annotated[int, Meta(ge=1, le=bounds.MAX_ACTIVE)]], _Series]
_Chunks = Annotated[list[Annotated[int, Meta(ge=1, le=bounds.MAX_CHUNK)]], _Series]
_StepSeconds = Annotated[
    list[Annotated[float, Meta(ge=bounds.MIN_STEP_S, le=bounds.MAX_STEP_S)]], _Series
]
_Rates = Annotated[list[Rate], _Series]
_Samples = Annotated[list[Annotated[int, Meta(ge=1, le=bounds.COUNT_CAP)]], _Series]


class StepReport(Struct, frozen=True, rename=_STEP_KEYS):
    """A worker's measured step costs on the wire (``common.steptime.StepModel``,
    short keys: ``b``, ``s``, ...). Each value within its bounds here; the rules
    across lists (equal lengths, sizes increasing) are ``StepModel``'s, and a model
    that breaks them is ignored by the router, not its heartbeat."""

    decode_batch: _Sizes = []
    decode_step_s: _StepSeconds = []
    decode_samples: _Samples = []
    context: Annotated[float, Meta(ge=0, le=bounds.MAX_CONTEXT)] = 0.0
    context_s: Annotated[float, Meta(ge=0, le=1)] = 0.0
    prefill_chunk: _Chunks = []
    prefill_tok_s: _Rates = []
    prefill_samples: _Samples = []


_Tokens = Annotated[int, Meta(ge=0, le=bounds.MAX_COUNT)]


class DoneStats(Struct, frozen=True):
    """How a request went (``Done.stats``): the worker's part, then what only the
    router measures. Every field is optional; docs/PROTOCOL.md "Done stats"."""

    prompt_tokens: _Tokens | None = None
    cached_tokens: _Tokens | None = None  # prompt tokens reused from the prefix cache
    output_tokens: _Tokens | None = None
    worker_queue_s: Seconds | None = None
    prefill_s: Seconds | None = None
    decode_s: Seconds | None = None
    worker: Id | None = None
    queue_s: Seconds | None = None
    ttft_s: Seconds | None = None
    e2e_s: Seconds | None = None
    policy: Label | None = None
    router_cached_estimate: _Tokens | None = None
    rerouted_from: list[Id] = []
    migrated_tokens: _Tokens | None = None

    def as_dict(self) -> dict[str, Any]:
        """The stats a client's Result shows: every field that is set."""
        return {k: v for k, v in msgspec.structs.asdict(self).items() if v is not None}


class RequestRow(Struct, frozen=True):
    """One request as a worker's heartbeat lists it (active or queued)."""

    id: Id
    prompt: Count  # prompt tokens
    cached: Count  # of which reused from the prefix cache
    prefill_remaining: Count
    decode_remaining: Count


# ---------------------------------------------------------------- handshake
class Hello(Message, tag="hello"):
    """Client -> router on connect; the router answers Welcome or Error."""

    name: str = ""


class Welcome(Message, tag="welcome"):
    """Router -> client (answering Hello) or -> worker (acknowledging Ready)."""

    router: str = "tandem"
    policy: str = ""
    epoch: str = ""  # random per router start (broker/identity.py)


# ---------------------------------------------------------------- client -> router
class Submit(Message, tag="submit"):
    """A generation request. Exactly one of prompt / tokens / messages is set.

    ``worker`` pins the request to a worker selector (id or device label).
    """

    request_id: Id
    prompt: str | None = None
    tokens: list[TokenId] | None = None
    # free-form (validation.tree_problem); how many: its header says, checked first
    messages: Annotated[list[dict[str, Any]], Meta(max_length=bounds.MAX_MESSAGES)] | None = None
    sampling: SamplingParams = SamplingParams()
    stream: bool = True
    worker: Id | None = None


class Cancel(Message, tag="cancel"):
    """Client -> router, router -> worker. Idempotent: unknown ids are ignored."""

    request_id: Id


class StatusQuery(Message, tag="status"):
    """Client -> router: answered with StatusReply."""


class StatusReply(Message, tag="status_reply"):
    """Router -> client: the registry as the router sees it (one dict per worker)."""

    policy: str
    workers: list[dict[str, Any]]
    requests_in_flight: int = 0
    requests_pending: int = 0  # waiting for a worker (none yet, or theirs was lost)
    activity: dict[str, Any] = {}  # totals, recent decisions
    starting: list[dict[str, Any]] = []  # workers announced, not yet registered (Starting)


# ---------------------------------------------------------------- router -> client
class Accepted(Message, tag="accepted"):
    request_id: Id
    worker_id: Id
    prompt_tokens: Count
    cached_tokens: Count = 0


class TokenDelta(Message, tag="tokens"):
    """Worker -> router -> client: newly generated token ids and their text."""

    request_id: Ref
    token_ids: Tokens
    text: Text
    logprobs: list[TokenLogprob] | None = None  # one per token id, when the request asked


class StepTokens(Message, tag="step_tokens"):
    """Worker -> router: the token deltas of several requests in one frame, as a
    worker's I/O thread found them waiting together (one engine step's, usually):
    entry i is ``TokenDelta(request_ids[i], token_ids[i], texts[i], logprobs[i])``.
    The router relays each to its client as that TokenDelta; clients never see this
    frame. ``logprobs`` is None when no request in the frame asked for them."""

    request_ids: Annotated[list[Ref], Meta(max_length=bounds.MAX_DELTAS_PER_FRAME)]
    token_ids: list[Tokens]
    texts: list[Text]
    logprobs: list[list[TokenLogprob] | None] | None = None

    def deltas(self) -> list[TokenDelta]:
        rids, ids, texts = self.request_ids, self.token_ids, self.texts
        if self.logprobs is None:
            return [TokenDelta(r, t, x) for r, t, x in zip(rids, ids, texts, strict=True)]
        return [
            TokenDelta(r, t, x, lp)
            for r, t, x, lp in zip(rids, ids, texts, self.logprobs, strict=True)
        ]


class Done(Message, tag="done"):
    """End of a request's stream. ``stats`` keys: see docs/PROTOCOL.md."""

    request_id: Id
    finish_reason: FinishReason
    stats: DoneStats = DoneStats()


class Error(Message, tag="error"):
    code: ErrorCode
    message: Text
    request_id: str | None = None
    # With OVERLOADED: when trying again may succeed.
    retry_after_s: Annotated[float, Meta(ge=0, le=3600)] | None = None


# ---------------------------------------------------------------- worker <-> router
class Ready(Message, tag="ready"):
    """Worker -> router on connect (and again when asked to re-register)."""

    worker_id: Id
    backend: Id
    device: Id
    model: Id
    max_active: Annotated[int, Meta(ge=1, le=bounds.MAX_ACTIVE)]
    n_ctx: Annotated[int, Meta(ge=1, le=bounds.MAX_N_CTX)]
    block_size: Annotated[int, Meta(ge=1, le=4096)]
    prefill_tok_s: Rate
    # Aggregate decode tok/s at batch size 1, 2, ... max_active.
    decode_tok_s: Annotated[list[Rate], Meta(min_length=1, max_length=bounds.MAX_ACTIVE)]
    heartbeat_s: Annotated[float, Meta(ge=bounds.HEARTBEAT_S[0], le=bounds.HEARTBEAT_S[1])]
    # common.tokenizer.TokenizerSpec.to_wire(), or {} when only the hash is sent: a
    # router that already has that tokenizer needs no 1.5 MB spec per worker.
    tokenizer: dict[str, Any]
    max_tokens_limit: Annotated[int, Meta(ge=1, le=bounds.MAX_N_CTX)] = 4096
    instance: Label = ""  # random per process start: tells a restart from a repeated Ready
    tokenizer_hash: str = ""  # tokenizer_hash(spec); "" = not given (the spec must be)
    step_tokens: int = 256  # the engine's per-step token budget (finish-time prediction)
    weights: Label = ""  # digest of the weights (common.gguf_file.weights_digest); "" unknown
    # Rates not yet borne out by steps served here (a stored profile, a quick start-up
    # measurement): the router trusts them less until its live step model has enough.
    provisional: bool = False
    # The Capability values it serves; strings, so a router reads a newer worker's list.
    capabilities: Annotated[list[Label], Meta(max_length=32)] = []
    # The machine it runs on (common/nodes.py: TANDEM_NODE or the host's name); "" unknown.
    node: NodeName = ""
    # Batch sizes where its start-up measurement found the aggregate decode rate step
    # down (common/ratefit.measured_drops: a kernel change, 9 rows slower than 8): the
    # router's fit keeps the drop there instead of smoothing it (only where
    # decode_tok_s still drops there; other sizes are ignored).
    decode_steps: Annotated[list[Annotated[int, Meta(ge=2, le=bounds.MAX_ACTIVE)]],
                            Meta(max_length=bounds.MAX_ACTIVE)] = []  # fmt: skip


class StartStage(StrEnum):
    """Where a starting worker is (``Starting.stage``)."""

    LOADING = "loading"  # its model (and, for a GPU, its device)
    MEASURING = "measuring"  # its step times, before it can price itself
    REGISTERING = "registering"  # prices known: its Ready follows


class Starting(Message, tag="starting"):
    """Worker -> router while it starts, from a connection of its own (its Ready's
    identity needs what loading builds): who is coming and when. Sent at once, on
    each stage change and every ``every_s`` until its Ready; the router lists it in
    ``StatusReply.starting`` (broker/starting.py) and answers nothing."""

    worker_id: Id
    instance: Id  # its Ready's: the Ready replaces the announcement
    device: Id  # as configured until the backend names it (``auto`` at first)
    model: Id  # its display name (common.model_files.model_display_name)
    stage: StartStage = StartStage.LOADING
    eta_s: Annotated[float, Meta(ge=0, le=86400)] | None = None  # seconds left; None unknown
    every_s: Annotated[float, Meta(ge=bounds.HEARTBEAT_S[0], le=bounds.HEARTBEAT_S[1])] = 1.0


def tokenizer_hash(spec: dict[str, Any]) -> str:
    """A stable name for a tokenizer spec: equal specs, equal hashes, on any peer."""
    text = json.dumps(spec, sort_keys=True, ensure_ascii=False, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class Heartbeat(Message, tag="heartbeat"):
    """Worker -> router, on a period and at once when its queue or cache changes.

    ``active`` / ``queued``: one RequestRow per request.
    ``cache``: prefix-block changes, see common.blocks.CacheLog.
    ``steps``: the worker's measured step costs (``common.steptime.StepModel``
    wire form), only when they changed (at most every ``steps_every_s``) or on
    a resync; None otherwise, and the router keeps the last one it got.
    """

    worker_id: Id
    seq: Annotated[int, Meta(ge=0, le=1 << 62)]
    active: list[RequestRow]
    queued: list[RequestRow]
    kv_used_tokens: Count
    kv_capacity_tokens: Count
    cache: CacheReport
    steps: StepReport | None = None


class Assign(Message, tag="assign"):
    """Router -> worker: a whole request, already tokenized."""

    request_id: Id
    tokens: list[TokenId]
    sampling: SamplingParams
    resume: Count = 0  # a migrated stream: the last ``resume`` tokens were already output


class Reregister(Message, tag="reregister"):
    """Router -> worker: "I do not know you" (e.g. the router restarted): send Ready.

    ``tokenizer``: the router lacks the tokenizer a hash-only Ready named: send the
    Ready again with the full spec.
    """

    tokenizer: bool = False


class ResyncCache(Message, tag="resync_cache"):
    """Router -> worker: a cache delta did not apply; send the full block set next."""


class Batch(Message, tag="batch"):
    """Several messages for one peer in one frame, in order; each entry is a message's
    map without ``v`` (the frame's covers it). The router sends a client or worker
    what one pass of its loop owes it (Accepteds, tokens, Dones; Assigns); a worker's
    I/O thread sends the router what it finds waiting together (a step's tokens and
    Dones). The router's cost is per frame, not per message
    (docs/results/router-overhead.md). Receivers read it with ``decode_all`` /
    ``entries`` (or ``DealerSocket.recv``) as if every entry had come in its own
    frame; clients never send one."""

    # Each entry stays packed until ``entries`` reads it (a bad one is refused alone).
    messages: Annotated[list[msgspec.Raw], Meta(min_length=1, max_length=bounds.MAX_BATCH)]


class Goodbye(Message, tag="goodbye"):
    """Worker -> router on clean shutdown; its in-flight requests are re-routed or failed."""

    worker_id: Id


MESSAGE_TYPES: dict[str, type[Message]] = {
    str(cls.__struct_config__.tag): cls  # each declares a string tag
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
        Starting,
        Heartbeat,
        Assign,
        Reregister,
        ResyncCache,
        Goodbye,
        Batch,
    )
}


for _tag, _cls in MESSAGE_TYPES.items():
    _cls.TYPE = _tag

# A copy of a message (or a nested value) with some fields changed.
replace = msgspec.structs.replace

# ---------------------------------------------------------------- encoding
# One decoder for every message (common/codec.py); a frame is decoded once.
_WIRE = Wire(MESSAGE_TYPES, PROTOCOL_VERSION)


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
_BATCH_HEAD = msgspec.msgpack.encode({"v": PROTOCOL_VERSION, "type": Batch.TYPE})
_BATCH_HEAD = bytes((_BATCH_HEAD[0] + 1,)) + _BATCH_HEAD[1:] + msgspec.msgpack.encode("messages")
_MAP_HEADS = frozenset(range(0x80, 0x90)) | {0xDE, 0xDF}


def decode(frame: bytes) -> Message:
    """Parse and validate one frame; raise ProtocolError on anything unexpected, and
    nothing else, whatever the bytes (the boundary every received frame crosses).
    A ``batch`` frame comes back as a Batch of packed entries (see ``decode_all``)."""
    try:
        # Nesting is bounded before the decoder recurses into the frame (a ~1 KB frame
        # nested 1,000 deep made msgspec raise RecursionError): common/framescan.py.
        deep = scan(frame) if len(frame) > MAX_FRAME_DEPTH else None
        if deep is not None:
            raise _scan_refusal(deep)
        try:
            msg = _WIRE.decode(frame)
        except DECODE_ERRORS as exc:
            raise _refusal(frame, exc, False) from None
        if msg.v != PROTOCOL_VERSION:
            raise ProtocolError(VERSION_MISMATCH, _WIRE.version_words(msg.v), _request_id(msg))
        msg.v = None  # a message in memory is the same whichever frame brought it
        if type(msg) is Batch and not all(memoryview(e)[0] in _MAP_HEADS for e in msg.messages):
            raise ProtocolError(BAD_REQUEST, "batch.messages: expected a list of maps")
        _check(msg)
        return msg
    except ProtocolError:
        raise
    except Exception as exc:  # a peer's bytes must never raise anything else
        raise _unreadable(exc) from None


def check(msg: Message) -> ProtocolError | None:
    """What a receiver's ``decode`` would refuse in ``msg``, built here rather than
    decoded (a client's Submit before it leaves): the same types, bounds and rules,
    checked by packing and reading it. None when it would pass."""
    try:
        frame = encode(msg)
    except (OverflowError, UnicodeEncodeError, TypeError, ValueError) as exc:
        words = f"{msg.TYPE} cannot be sent: {type(exc).__name__}: {exc}"
        return ProtocolError(BAD_REQUEST, words, _request_id(msg))
    try:
        decode(frame)
    except ProtocolError as exc:
        return exc
    return None


def _refusal(data: Any, exc: Exception, in_batch: bool) -> ProtocolError:
    code, words, rid, path = _WIRE.refusal(data, exc, in_batch)
    return ProtocolError(code, words, rid, field=path)


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


def _check(msg: Message) -> None:
    """The rules across fields and free-form values (common/validation.py)."""
    problem = message_problem(msg)
    if problem is not None:
        raise ProtocolError(problem.code, problem.message, _request_id(msg), field=problem.field)


def _request_id(msg: Message) -> str | None:
    rid = getattr(msg, "request_id", None)
    return rid if type(rid) is str else None


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
            out.append(_entry(raw))
        except ProtocolError as exc:
            out.append(exc)
        except Exception as exc:  # as in decode: nothing else leaves a peer's bytes
            out.append(_unreadable(exc))
    return out


def _entry(raw: Any) -> Message:
    try:
        msg = _WIRE.decode(raw)
    except DECODE_ERRORS as exc:
        raise _refusal(raw, exc, True) from None
    if msg.v is not None:  # the frame's version covers its entries
        raise ProtocolError(BAD_REQUEST, f"{msg.TYPE}: unknown field 'v' in a batch entry",
                            _request_id(msg), field="v")  # fmt: skip
    if type(msg) is Batch:
        raise ProtocolError(BAD_FRAME, "unknown message type 'batch' in a batch")
    _check(msg)
    return msg
