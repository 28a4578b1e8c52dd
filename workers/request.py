"""One request's state inside a worker: counters plus a status.

The engine moves a request QUEUED -> PREFILL -> DECODE -> FINISHED; prefill
progress is ``n_computed`` of ``len(prompt)`` tokens, decode progress is
``len(output)`` of ``max_tokens``. Text is decoded incrementally from token
bytes, and stop strings are held back until they can no longer start a match.
"""

from __future__ import annotations

import codecs
import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from tandem.common import protocol as p
from tandem.common.protocol import Assign, FinishReason, RequestRow, SamplingParams


class TokenLogprobs(NamedTuple):
    """A sampled token's log-probability and the top alternatives', as a backend
    computes them (the engine adds the pieces and sends them as TokenLogprob)."""

    logprob: float
    top_ids: list[int]  # likeliest first
    top_logprobs: list[float]


class Status(enum.Enum):
    QUEUED = "queued"
    PREFILL = "prefill"
    DECODE = "decode"
    FINISHED = "finished"


@dataclass
class Request:
    id: str
    prompt: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    status: Status = Status.QUEUED
    n_cached: int = 0  # prompt tokens reused from the prefix cache
    n_computed: int = 0  # prompt tokens whose KV exists (cached ones included)
    n_fed: int = 0  # output tokens fed back through the model (all but the newest)
    output: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    resumed: int = 0  # a migrated stream: the prompt's last ``resumed`` ids were output before
    slot: Any = None  # backend handle while active (llama.cpp seq id, MLX cache)
    sampler: Any = None  # backend sampler state
    token_logprobs: TokenLogprobs | None = None  # the newest token's, when the request asked
    t_arrive: float = field(default_factory=time.monotonic)
    t_admit: float = 0.0
    t_first: float = 0.0
    t_done: float = 0.0
    text: TextStream = field(init=False)

    def __post_init__(self) -> None:
        self.text = TextStream(self.sampling.stop)

    @classmethod
    def from_assign(cls, msg: Assign) -> Request:
        return cls(
            id=msg.request_id, prompt=list(msg.tokens), sampling=msg.sampling, resumed=msg.resume
        )

    @property
    def max_tokens(self) -> int:
        return self.sampling.max_tokens

    @property
    def prefill_only(self) -> bool:
        return self.sampling.prefill_only

    @property
    def decoding(self) -> bool:
        return self.status is Status.DECODE

    @property
    def prefill_remaining(self) -> int:
        return len(self.prompt) - self.n_computed

    @property
    def decode_remaining(self) -> int:
        return 0 if self.prefill_only else self.max_tokens - len(self.output)

    def resumed_output(self) -> list[int]:
        """A migrated stream's tokens sent before it moved (the prompt's tail): output
        to the penalties and a grammar, not prompt."""
        return self.prompt[len(self.prompt) - self.resumed :] if self.resumed else []

    def kv_tokens(self) -> list[int]:
        """Tokens whose KV this request's slot holds."""
        return self.prompt[: self.n_computed] + self.output[: self.n_fed]

    def summary(self) -> RequestRow:
        """This request as a heartbeat lists it."""
        return RequestRow(
            id=self.id,
            prompt=len(self.prompt),
            cached=self.n_cached,
            prefill_remaining=self.prefill_remaining,
            decode_remaining=self.decode_remaining,
        )

    def stats(self) -> p.DoneStats:
        t_prefilled = self.t_first or self.t_done
        return p.DoneStats(
            prompt_tokens=len(self.prompt),
            cached_tokens=self.n_cached,
            output_tokens=len(self.output),
            worker_queue_s=max(0.0, (self.t_admit or self.t_done) - self.t_arrive),
            prefill_s=max(0.0, t_prefilled - self.t_admit) if self.t_admit else 0.0,
            decode_s=max(0.0, self.t_done - self.t_first) if self.t_first else 0.0,
        )


class TextStream:
    """Incremental detokenization with stop strings.

    ``feed(piece_bytes)`` returns the text that is safe to emit now: multi-byte
    characters are completed first, and text that could still be the start of a
    stop string is held back. ``stopped`` turns true at the first stop string;
    the text before it is emitted, the stop string itself is not.
    """

    def __init__(self, stop: list[str]) -> None:
        self.stop = [s for s in stop if s]
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""  # decoded but not yet emitted
        self.stopped = False

    def feed(self, piece: bytes) -> str:
        if self.stopped:
            return ""
        self._pending += self._utf8.decode(piece)
        return self._release()

    def flush(self) -> str:
        """Everything still held (at the end of generation)."""
        if self.stopped:
            return ""
        self._pending += self._utf8.decode(b"", final=True)
        out, self._pending = self._pending, ""
        return out

    def _release(self) -> str:
        if not self.stop:
            out, self._pending = self._pending, ""
            return out
        cut = min((i for i in (self._pending.find(s) for s in self.stop) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            out, self._pending = self._pending[:cut], ""
            return out
        keep = self._held_suffix()
        out = self._pending[: len(self._pending) - keep]
        self._pending = self._pending[len(self._pending) - keep :]
        return out

    def _held_suffix(self) -> int:
        """Length of the longest pending suffix that is a proper prefix of a stop string."""
        best = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(self._pending)), best, -1):
                if self._pending.endswith(s[:n]):
                    best = n
                    break
        return best


def sampling_problem(req: Request, backend: Any) -> p.Problem | None:
    """What ``backend`` cannot do of what ``req`` asks: the router routes by
    capabilities, and this keeps a request that got here anyway from being served
    without them. A backend may define ``problem(req) -> str | None`` for its own
    checks (a json_schema its grammar engine cannot take)."""
    s = req.sampling
    missing = s.needs() - set(getattr(backend, "capabilities", ()))
    if missing:
        return p.Problem.bad_request(f"this worker cannot serve {', '.join(sorted(missing))}")
    if any(not 0 <= t < backend.vocab_size for t in s.logit_bias):
        return p.Problem.bad_request("logit_bias names a token id out of the vocabulary")
    check = getattr(backend, "problem", None)
    message = check(req) if check is not None else None
    return p.Problem.bad_request(message) if message else None


def wire_logprob(token: int, lp: TokenLogprobs, piece: Callable[[int], bytes]) -> p.TokenLogprob:
    """The wire's entry for a sampled token, its text pieces decoded leniently."""

    def text(t: int) -> str:
        return piece(t).decode(errors="replace")

    top = [(t, text(t), v) for t, v in zip(lp.top_ids, lp.top_logprobs, strict=True)]
    return p.TokenLogprob(id=token, token=text(token), logprob=lp.logprob, top=top)


def decode_context(decode: list[Request]) -> int:
    """The KV tokens a step's decode rows attend over, summed: the context the engine's
    step timer records with the step (decode slows as it grows)."""
    return sum(r.n_computed + r.n_fed for r in decode)


def shared_prefix(a: list[int], b: list[int], block: int, limit: int) -> int:
    """Tokens at the start of ``a`` and ``b`` alike, in whole blocks, at most ``limit``
    (slices compare a block at a time in C)."""
    n = 0
    while n + block <= limit and a[n : n + block] == b[n : n + block]:
        n += block
    return n


def prefix_leader(
    active: list[Request], req: Request, cached: int, block: int
) -> tuple[Request, int] | None:
    """The active request whose prompt shares the longest block-aligned prefix with
    ``req``'s, longer than the ``cached`` tokens the prefix cache has, and that
    length; None if none does. Like a cache match it leaves ``req`` a prompt token
    to compute (its logits start the output)."""
    limit = len(req.prompt) - 1
    best: tuple[Request, int] | None = None
    for r in active:
        n = shared_prefix(r.prompt, req.prompt, block, min(limit, len(r.prompt)))
        if n > cached and (best is None or n > best[1]):
            best = (r, n)
    return best
