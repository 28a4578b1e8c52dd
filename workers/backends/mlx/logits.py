"""Logits processing on the MLX batch: logit_bias and penalties before sampling, and
the log-probabilities a request asked for.

The same semantics as the llama.cpp backend (workers/backends/llama_sampling.py):
logit_bias is added first; the repetition penalty (HF/vLLM: divide a positive logit,
multiply a negative one) sees prompt and output; presence and frequency penalties
(OpenAI: ``logit -= frequency * count + presence * (count > 0)``) count the output
only. Each step works on the rows that asked, all of them in one vectorised pass per
kind; a batch in which no row asked pays nothing (``sample`` never calls in here).

A row's history lives on the device as per-token counts, and the counts after a
step are returned, not stored, so a speculative step can be dropped as its keys are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import mlx.core as mx

from tandem.common.protocol import SamplingParams
from tandem.workers.request import Request, TokenLogprobs


@dataclass(frozen=True)
class Processing:
    """One request's logits processing (None from ``create`` when it asks for none)."""

    bias: mx.array | None  # (vocab,) float32, added to the logits
    repetition: float  # 1.0: off
    presence: float
    frequency: float
    logprobs: int | None  # None: not asked; n: the chosen token's plus the top n

    @classmethod
    def create(cls, s: SamplingParams, vocab_size: int) -> Processing | None:
        bias = None
        if s.logit_bias:
            ids = mx.array(list(s.logit_bias.keys()))
            values = mx.array(list(s.logit_bias.values()), mx.float32)
            bias = mx.zeros((vocab_size,), mx.float32).at[ids].add(values)
        out = cls(bias, s.repetition_penalty, s.presence_penalty, s.frequency_penalty, s.logprobs)
        return out if out.changes_logits or out.logprobs is not None else None

    @property
    def changes_logits(self) -> bool:
        return self.bias is not None or self.penalizes_history or self.penalizes_output

    @property
    def penalizes_history(self) -> bool:
        return self.repetition != 1.0

    @property
    def penalizes_output(self) -> bool:
        return bool(self.presence or self.frequency)


@dataclass(frozen=True)
class History:
    """Per-token counts on the device: ``seen`` over prompt and output (repetition),
    ``output`` over the output (presence, frequency); None where unused."""

    seen: mx.array | None
    output: mx.array | None

    @classmethod
    def create(
        cls, proc: Processing | None, prompt: list[int], resumed: int, vocab_size: int
    ) -> History:
        if proc is None or not (proc.penalizes_history or proc.penalizes_output):
            return cls(None, None)
        seen = _counts(prompt, vocab_size) if proc.penalizes_history else None
        sent = prompt[len(prompt) - resumed :] if resumed else []  # a migrated stream's output
        output = _counts(sent, vocab_size) if proc.penalizes_output else None
        return cls(seen, output)

    def after(self, token: mx.array) -> History:
        """The counts once ``token`` (a lazy scalar) is produced."""
        if self.seen is None and self.output is None:
            return self
        return History(
            None if self.seen is None else self.seen.at[token].add(1.0),
            None if self.output is None else self.output.at[token].add(1.0),
        )


def _counts(tokens: list[int], vocab_size: int) -> mx.array:
    counts = mx.zeros((vocab_size,), mx.float32)
    return counts.at[mx.array(tokens)].add(1.0) if tokens else counts


def process(logits: mx.array, rows: list[tuple[int, Processing, History]]) -> mx.array:
    """``logits`` (rows, vocab) as float32, with each listed row's bias and penalties
    applied; rows not listed are unchanged."""
    x = logits.astype(mx.float32)
    biased = [(i, p.bias) for i, p, _ in rows if p.bias is not None]
    if biased:
        idx = mx.array([i for i, _ in biased])
        x[idx] = x[idx] + mx.stack([b for _, b in biased])
    rep = [(i, p, h.seen) for i, p, h in rows if h.seen is not None]
    if rep:
        idx = mx.array([i for i, _, _ in rep])
        penalty = mx.array([p.repetition for _, p, _ in rep], mx.float32)[:, None]
        seen = mx.stack([s for _, _, s in rep]) > 0
        sub = x[idx]
        x[idx] = mx.where(seen, mx.where(sub <= 0, sub * penalty, sub / penalty), sub)
    out = [(i, p, h.output) for i, p, h in rows if h.output is not None]
    if out:
        idx = mx.array([i for i, _, _ in out])
        counts = mx.stack([c for _, _, c in out])
        freq = mx.array([p.frequency for _, p, _ in out], mx.float32)[:, None]
        pres = mx.array([p.presence for _, p, _ in out], mx.float32)[:, None]
        x[idx] = x[idx] - counts * freq - (counts > 0) * pres
    return x


@dataclass
class RowLogprobs:
    """Lazy log-probabilities of some rows' chosen tokens and their top alternatives."""

    rows: list[int]  # batch rows, in order
    chosen: mx.array  # (len(rows),)
    top_ids: mx.array  # (len(rows), n): n is the largest any of the rows asked for
    top_logprobs: mx.array
    wanted: list[int]  # how many alternatives each row asked for

    def arrays(self) -> list[mx.array]:
        return [self.chosen, self.top_ids, self.top_logprobs]

    def hand_to(self, reqs: list[Request]) -> None:
        """Give each asking row's (evaluated) logprobs to its request (``reqs`` by
        batch row), where the engine takes them."""
        chosen = cast(list[float], self.chosen.tolist())
        ids = cast(list[list[int]], self.top_ids.tolist())
        values = cast(list[list[float]], self.top_logprobs.tolist())
        for j, row in enumerate(self.rows):
            n = self.wanted[j]
            reqs[row].token_logprobs = TokenLogprobs(chosen[j], ids[j][:n], values[j][:n])

    def select(self, keep: list[int]) -> RowLogprobs | None:
        """These log-probabilities for batch rows ``keep`` (old indices, in order),
        renumbered as the rows will be; None when no row that asked is kept."""
        pos = {row: j for j, row in enumerate(self.rows)}
        picked = [(new, pos[old]) for new, old in enumerate(keep) if old in pos]
        if not picked:
            return None
        at = mx.array([j for _, j in picked])
        return RowLogprobs(
            [new for new, _ in picked],
            self.chosen[at],
            self.top_ids[at],
            self.top_logprobs[at],
            [self.wanted[j] for _, j in picked],
        )


def logprobs(x: mx.array, tokens: mx.array, rows: list[tuple[int, int]]) -> RowLogprobs:
    """Log-softmax of processed logits ``x`` at ``rows`` ((batch row, n alternatives)),
    the chosen ``tokens``' entries and the top n, likeliest first."""
    idx = mx.array([i for i, _ in rows])
    lp = x[idx]
    lp = lp - mx.logsumexp(lp, axis=-1, keepdims=True)
    chosen = mx.take_along_axis(lp, tokens[idx][:, None].astype(mx.int32), axis=-1)[:, 0]
    n = min(max(k for _, k in rows), x.shape[-1])
    if n == 0:
        top_ids = mx.zeros((len(rows), 0), mx.int32)
    else:
        top_ids = mx.argpartition(-lp, kth=n - 1, axis=-1)[:, :n]
        order = mx.argsort(-mx.take_along_axis(lp, top_ids, axis=-1), axis=-1)
        top_ids = mx.take_along_axis(top_ids, order, axis=-1)
    top_lp = mx.take_along_axis(lp, top_ids, axis=-1)
    return RowLogprobs([i for i, _ in rows], chosen, top_ids, top_lp, [k for _, k in rows])
