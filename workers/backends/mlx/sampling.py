"""The MLX worker's per-request samplers: one token per batch row, each row with its
own settings, PRNG key and history (llama.cpp's chain order: logits processing, then
top-k, top-p on the renormalized rest, min-p, temperature)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from tandem.common.protocol import SamplingParams
from tandem.workers.backends.mlx import grammar
from tandem.workers.backends.mlx.logits import History, Processing, RowLogprobs, logprobs, process

# What this backend serves (docs/PROTOCOL.md, Ready.capabilities): json_schema only
# with llguidance installed (grammar.py); without it the router sends those to llama.cpp.
CAPABILITIES: tuple[str, ...] = ("penalties", "logit_bias", "min_p", "logprobs") + (
    ("json_schema", "json_schema_full") if grammar.AVAILABLE else ()
)


@dataclass(frozen=True)
class RowState:
    """What a step advances: the PRNG key (None when greedy) and the penalty history.
    ``sample`` returns the next states instead of storing them, so a speculative step
    can be dropped without advancing any request's random stream or history."""

    key: mx.array | None
    history: History


@dataclass
class Sampler:
    """One request's sampling settings and current state."""

    temperature: float
    top_p: float
    top_k: int
    min_p: float
    proc: Processing | None  # None: the logits are used as the model gives them
    state: RowState
    matcher: Any = None  # json_schema's automaton (grammar.py); advanced by the backend

    @classmethod
    def create(
        cls,
        s: SamplingParams,
        prompt: list[int],
        resumed: int,
        vocab_size: int,
        matcher: Any = None,
    ) -> Sampler:
        proc = Processing.create(s, vocab_size)
        history = History.create(proc, prompt, resumed, vocab_size)
        if s.temperature <= 0:
            return cls(0.0, 1.0, 0, 0.0, proc, RowState(None, history), matcher)
        seed = s.seed if s.seed is not None else random.getrandbits(32)
        state = RowState(mx.random.key(seed), history)
        return cls(s.temperature, s.top_p, s.top_k, s.min_p, proc, state, matcher)

    @property
    def plain(self) -> bool:
        """Greedy on the raw logits, nothing asked: the batch's shared argmax."""
        return self.proc is None and self.state.key is None and self.matcher is None


def sample(
    logits: mx.array, samplers: list[Sampler]
) -> tuple[mx.array, list[RowState], RowLogprobs | None]:
    """One token per row of ``logits`` (lazy), each sampler's next state, and the
    log-probabilities of the rows that asked (lazy; None when none did)."""
    if all(s.plain for s in samplers):  # the common case: one argmax for the batch
        return mx.argmax(logits, axis=-1).astype(mx.int32), [s.state for s in samplers], None
    rows = [(i, s.proc, s.state.history) for i, s in enumerate(samplers) if s.proc is not None]
    changing = [r for r in rows if r[1].changes_logits]
    x = process(logits, changing) if changing else logits
    constrained = [(i, s.matcher) for i, s in enumerate(samplers) if s.matcher is not None]
    tokens, keys = _choose(grammar.constrain(x, constrained) if constrained else x, samplers)
    states = [
        RowState(key, s.state.history.after(tokens[i]))
        for i, (s, key) in enumerate(zip(samplers, keys, strict=True))
    ]
    asked = [(i, p.logprobs) for i, p, _ in rows if p.logprobs is not None]
    lps = logprobs(x.astype(mx.float32), tokens, asked) if asked else None
    return tokens, states, lps


def _choose(x: mx.array, samplers: list[Sampler]) -> tuple[mx.array, list[mx.array | None]]:
    if all(s.state.key is None for s in samplers):
        return mx.argmax(x, axis=-1).astype(mx.int32), [None] * len(samplers)
    tokens: list[mx.array] = []
    keys: list[mx.array | None] = []
    for i, s in enumerate(samplers):
        if s.state.key is None:
            tokens.append(mx.argmax(x[i], axis=-1).astype(mx.int32))
            keys.append(None)
            continue
        next_key, use = mx.random.split(s.state.key)
        tokens.append(_sample_row(x[i].astype(mx.float32), s, use))
        keys.append(next_key)
    return mx.stack(tokens), keys


def _sample_row(x: mx.array, s: Sampler, key: mx.array) -> mx.array:
    if s.top_k <= 0 and s.top_p >= 1.0 and s.min_p <= 0.0:
        return mx.random.categorical(x / s.temperature, key=key).astype(mx.int32)
    order, xs = truncated(x, s.top_k, s.top_p, s.min_p)
    j = mx.random.categorical(xs / s.temperature, key=key)
    return order[j].astype(mx.int32)


def truncated(x: mx.array, top_k: int, top_p: float, min_p: float) -> tuple[mx.array, mx.array]:
    """``x``'s token order, likeliest first, and its sorted logits with the tokens
    top-k, then top-p (on what top-k kept), then min-p drop set to -inf."""
    order = mx.argsort(-x)  # descending: top-k and top-p are prefixes of it
    xs = x[order]
    if top_k > 0:
        xs = mx.where(mx.arange(xs.shape[0]) < top_k, xs, -mx.inf)
    if top_p < 1.0:
        p = mx.softmax(xs)
        xs = mx.where(mx.cumsum(p) - p < top_p, xs, -mx.inf)  # always keeps the first
    if min_p > 0.0:  # p >= min_p * p_max, i.e. logit >= max + log(min_p)
        xs = mx.where(xs >= xs[0] + math.log(min_p), xs, -mx.inf)
    return order, xs
