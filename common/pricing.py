"""The rates a worker is priced with: live step times, the profile as a prior.

The router prices every worker with it; a worker that measured itself at start
(``workers.profiler.warm_up``) uses it too, to fold that measurement into the
rates it advertises (its measurement then outweighs the profile, ``prior_samples``).

A worker's Ready carries its profile (``tandem profile``: measured once, in
isolation, at one context); its heartbeats carry the live step-time model
(``common.steptime``: every step it actually ran). ``price`` combines them:

1. The profile is repaired first (``common.ratefit``): a point far off what its
   neighbours allow is replaced from them, then the table is made monotone.
2. Where the live model has decode samples at batch b, the rate is the geometric
   blend of live and profile, the profile weighing as much as PRIOR_SAMPLES steps
   (a few hundred steps later the profile no longer matters there).
3. Batch sizes without samples keep the profile's shape at the level live samples
   show: they are scaled by the live/profile factor of the sampled batch sizes
   around them (interpolated in log space), each factor shrunk toward 1 by its
   evidence. Past the sampled range the nearest factor is borrowed with its log
   divided by 1 + the doublings to it: a profile's shape can be wrong (the H200's
   GPU profile flattened from batch 8 while serving kept rising), and a worker
   priced too slow at sizes it has not run is never given the work that would
   show otherwise, while one priced too fast gets it and is measured. Nor may a
   guess beat physics: past the largest sampled size b1 with rate r1, at most
   r1 * b / b1 (a step never gets shorter with more rows); below the smallest,
   between r0 * b / b0 and r0.
4. A weighted monotone fit over the result (weights: PRIOR_SAMPLES + samples), so
   well-measured points decide where they disagree with guesses; on each side of a
   measured step down apart (``steps``: one the worker measured at start and told
   in its Ready; with ``find_steps``, also one the live steps show, by
   ``common.ratefit.measured_drops``: a GPU worker pricing its own start-up
   measurement), so a drop in aggregate rate that it really serves is priced, not
   smoothed. The router does not look for steps in served steps itself: a busy
   CPU's steps dip and stay low by chance, and the monotone fit is their remedy.

Prefill: the live rate of the largest chunk bucket of at least MIN_PREFILL_CHUNK
tokens, blended the same way (short chunks are dominated by per-step overhead and
say little about a cold prompt's rate).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from tandem.common.ratefit import Fit, fit_decode_rates, measured_drops, split_fit
from tandem.common.steptime import StepModel
from tandem.common.validation import MAX_RATE_TOK_S, MIN_RATE_TOK_S

PRIOR_SAMPLES = 8.0  # the profile weighs as much as this many measured steps
MIN_PREFILL_CHUNK = 64


@dataclass(frozen=True)
class Rates:
    """One worker's prices: what policies see, and what they came from."""

    prefill_tok_s: float
    decode_tok_s: tuple[float, ...]  # priced aggregate tok/s at batch 1..max_active
    live_prefill_tok_s: float | None = None
    live_decode_tok_s: tuple[float | None, ...] = ()  # measured, None where no samples
    live_decode_samples: tuple[int, ...] = ()
    context: float = 0.0  # context tokens per row the live decode rates hold at
    context_s: float = 0.0  # extra step seconds per context token per row
    prefill_by_chunk: tuple[tuple[int, float], ...] = ()
    repaired: tuple[int, ...] = ()  # profile batch sizes replaced as far off their neighbours
    steps: tuple[int, ...] = ()  # batch sizes a kept step down in the rates starts at


def price(
    prefill_prior: float,
    decode_prior: Sequence[float],
    max_active: int,
    model: StepModel | None = None,
    prior_samples: float = PRIOR_SAMPLES,
    steps: Sequence[int] = (),
    find_steps: bool = False,
) -> Rates:
    """A worker's rates from its profile and (when given) its live step model; the
    profile weighs as much as ``prior_samples`` measured steps; ``steps``: batch sizes
    where the worker measured a step down (its Ready's word, kept where the rates
    still drop there); ``find_steps``: keep a step down ``model`` measured too."""
    repaired = _repaired(tuple(decode_prior), max_active, tuple(steps))
    batches = range(1, max_active + 1)
    live = model.decode_tok_s() if model is not None else {}
    live = {b: x for b, x in live.items() if b <= max_active}
    kept = repaired.steps
    if live:
        if find_steps:
            kept = (*kept, *measured_drops(live))
        decode, kept = _blend_decode(list(repaired.rates), live, prior_samples, kept)
    else:
        decode = repaired.rates
    prefill, live_prefill = prefill_prior, _live_prefill(model)
    if live_prefill is not None:
        prefill *= _shrunk(live_prefill[0] / prefill_prior, live_prefill[1], prior_samples)
    measured = model if model is not None and live else StepModel()
    return Rates(
        prefill_tok_s=bounded_rate(prefill),
        decode_tok_s=tuple(map(bounded_rate, decode)),
        live_prefill_tok_s=live_prefill[0] if live_prefill else None,
        live_decode_tok_s=tuple(live[b][0] if b in live else None for b in batches),
        live_decode_samples=tuple(live[b][1] if b in live else 0 for b in batches),
        context=measured.context,
        context_s=measured.context_s,
        prefill_by_chunk=tuple(zip(model.prefill_chunk, model.prefill_tok_s, strict=True))
        if model is not None
        else (),
        repaired=repaired.dropped,
        steps=kept,
    )


def bounded_rate(tok_s: float) -> float:
    """A priced rate within the wire's bounds: a live rate is steps inverted (b / s at
    b <= 4096 rows, s >= 1 us), and no derivation may reach inf or 0."""
    if not math.isfinite(tok_s):  # NaN or inf: a report the bounds should have refused
        return MIN_RATE_TOK_S if math.isnan(tok_s) else MAX_RATE_TOK_S
    return min(MAX_RATE_TOK_S, max(MIN_RATE_TOK_S, tok_s))


def _blend_decode(
    prior: list[float],
    live: dict[int, tuple[float, int]],
    prior_samples: float,
    steps: tuple[int, ...] = (),
) -> tuple[tuple[float, ...], tuple[int, ...]]:
    """Steps 2-4 of the module docstring: blend, borrow the nearest factor, fit (apart
    on each side of a step down ``steps`` names); the rates and the steps kept."""
    logf = {
        b: math.log(_shrunk(rate / prior[b - 1], n, prior_samples)) for b, (rate, n) in live.items()
    }
    blended, weights = [], []
    for b in range(1, len(prior) + 1):
        lo = max((s for s in logf if s <= b), default=None)
        hi = min((s for s in logf if s >= b), default=None)
        if lo is None or hi is None:  # past the sampled range: borrow, less the further
            near = hi if lo is None else lo
            assert near is not None  # live is not empty: one side has a sampled size
            f = logf[near] / (1 + abs(math.log2(b / near)))
        elif lo == hi:
            f = logf[lo]
        else:  # between two sampled sizes: interpolate (in log space)
            f = logf[lo] + (logf[hi] - logf[lo]) * (b - lo) / (hi - lo)
        blended.append(prior[b - 1] * math.exp(f))
        weights.append(prior_samples + (live[b][1] if b in live else 0))
    b0, b1 = min(live), max(live)
    r0, r1 = blended[b0 - 1], blended[b1 - 1]
    for b in range(1, len(prior) + 1):
        if b > b1:
            blended[b - 1] = min(blended[b - 1], r1 * b / b1)
        elif b < b0:
            blended[b - 1] = min(r0, max(blended[b - 1], r0 * b / b0))
    cuts = {b - 1 for b in steps if 2 <= b <= len(prior)}
    fitted, kept = split_fit(blended, weights, cuts)
    return tuple(fitted), tuple(c + 1 for c in kept)


@functools.lru_cache(maxsize=1024)
def _repaired(prior: tuple[float, ...], max_active: int, steps: tuple[int, ...] = ()) -> Fit:
    """The profile's repair: fixed per worker, so computed once, not per heartbeat."""
    return fit_decode_rates(padded(prior, max_active), steps=steps)


def padded(rates: Sequence[float], n: int) -> list[float]:
    """``rates`` cut or extended to n entries (a plateau past the last one)."""
    out = [float(x) for x in rates[:n]]
    return out + [out[-1]] * (n - len(out))


def _shrunk(factor: float, samples: int, prior_samples: float = PRIOR_SAMPLES) -> float:
    """A live/prior factor, trusted by its evidence: 1 with no samples, the factor
    itself once samples outweigh the prior (geometric, so 2x and 1/2 are symmetric)."""
    share = samples / (samples + prior_samples)
    return math.exp(share * math.log(factor))


def _live_prefill(model: StepModel | None) -> tuple[float, int] | None:
    if model is None:
        return None
    big = [(c, r, n) for c, r, n in zip(model.prefill_chunk, model.prefill_tok_s,
                                        model.prefill_samples, strict=True)
           if c >= MIN_PREFILL_CHUNK]  # fmt: skip
    if not big:
        return None
    _, rate, n = big[-1]
    return rate, n


def tier_cached(matched: int, on_device: int, prefill_tok_s: float, restore_tok_s: float) -> int:
    """The cached tokens a policy may treat as free when ``matched`` tokens of a prompt
    are held and ``on_device`` of them on the device: the rest sit in host RAM and
    cost a restore (common/blocks.py tiers), i.e. ``prefill_tok_s / restore_tok_s``
    of a prefill each, so they count for ``1 -`` that. An unknown restore rate (0)
    counts them whole: llama.cpp restored SmolLM2 ~1,000-30,000x faster than it
    prefilled on a CPU (docs/results/prefix-cache-memory.md)."""
    host = matched - on_device
    if host <= 0 or restore_tok_s <= 0 or prefill_tok_s <= 0:
        return matched
    return on_device + round(host * max(0.0, 1.0 - prefill_tok_s / restore_tok_s))
