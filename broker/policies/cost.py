"""Token-aware policies: phase_cost (the default), least_tokens and cache_aware.

``phase_cost`` prices the two phases separately, because devices differ most in
prefill (a GPU is ~30x a CPU) and least in decode (a few x):

    score(w) = P(w) / prefill_rate(w) + D(w) / decode_rate(w)

P(w): prefill tokens still to compute on w (each active and queued request's
remaining prompt tokens after its cache discount) plus the new prompt's tokens
that w does not already cache. D(w): decode tokens still to produce on w (each
request's unused budget) plus the new request's budget. The decode rate is w's
aggregate rate at the batch size it would run with the new request added.
"""

from __future__ import annotations

from dataclasses import dataclass

from tandem.broker.policies.views import Decision, RouteRequest, WorkerView, tie_break


@dataclass(frozen=True)
class Terms:
    """The parts of one candidate's phase_cost score, for logs and explanations."""

    prefill_tokens: int  # P(w)
    decode_tokens: int  # D(w)
    prefill_rate: float  # tok/s
    decode_rate: float  # aggregate tok/s at the batch size w would run

    @property
    def seconds(self) -> float:
        return self.prefill_tokens / self.prefill_rate + self.decode_tokens / self.decode_rate


def phase_terms(req: RouteRequest, w: WorkerView) -> Terms:
    """P(w), D(w) and the rates phase_cost divides them by."""
    backlog_p, backlog_d = w.backlog
    # A worker always computes >= 1 prompt token (it needs the last token's logits),
    # so even a fully cached prompt costs one token.
    new_prefill = max(1, req.prompt_tokens - w.cached_tokens)
    batch = min(w.max_active, w.n_requests + 1)
    return Terms(
        backlog_p + new_prefill, backlog_d + req.max_tokens, w.prefill_rate, w.decode_rate(batch)
    )


def phase_seconds(req: RouteRequest, w: WorkerView) -> float:
    """``phase_terms(req, w).seconds`` without building Terms: the same arithmetic in
    the same order (so the same float), at a fraction of the cost per candidate."""
    backlog_p, backlog_d = w.backlog
    p = backlog_p + max(1, req.prompt_tokens - w.cached_tokens)
    return p / w.prefill_rate + (backlog_d + req.max_tokens) / w.next_decode_rate


class PhaseCost:
    """Seconds of work ahead of the request on each worker (the issue's cost model)."""

    name = "phase_cost"
    takes_any = True

    def choose(self, req: RouteRequest, workers: list[WorkerView]) -> Decision:
        return tie_break(workers, {w.id: phase_seconds(req, w) for w in workers})


class LeastTokens:
    """Fewest outstanding P + D tokens, ignoring how fast each worker is."""

    name = "least_tokens"
    takes_any = True

    def choose(self, req: RouteRequest, workers: list[WorkerView]) -> Decision:
        scores = {}
        for w in workers:
            t = phase_terms(req, w)
            scores[w.id] = float(t.prefill_tokens + t.decode_tokens)
        return tie_break(workers, scores)


class CacheAware:
    """Longest cached prefix unless load is imbalanced (the SGLang gateway's rule).

    Imbalanced: the busiest worker has more than ``balance_abs`` requests over the
    idlest and more than ``balance_rel`` times as many; then pick the least
    loaded. Otherwise pick the best cache match if it covers more than
    ``cache_threshold`` of the prompt, else the least loaded. (SGLang's fallback
    is the worker with the smallest radix tree; tandem's router does not track
    cache sizes per worker, and least loaded serves the same purpose of spreading
    new prefixes.) Thresholds are lower than SGLang's defaults (32 / 1.0001)
    because tandem runs a handful of workers with a few slots each.
    """

    name = "cache_aware"
    takes_any = True

    def __init__(
        self, cache_threshold: float = 0.5, balance_abs: int = 4, balance_rel: float = 1.5
    ) -> None:
        self.cache_threshold = cache_threshold
        self.balance_abs = balance_abs
        self.balance_rel = balance_rel

    def choose(self, req: RouteRequest, workers: list[WorkerView]) -> Decision:
        loads = [w.n_requests for w in workers]
        hi, lo = max(loads), min(loads)
        imbalanced = hi - lo > self.balance_abs and hi > self.balance_rel * lo
        best_hit = max(w.cached_tokens for w in workers)
        if imbalanced or best_hit <= self.cache_threshold * req.prompt_tokens:
            return tie_break(workers, {w.id: float(w.n_requests) for w in workers})
        # Score: uncached fraction of the prompt; ties fall back to load, then id.
        scores = {w.id: 1.0 - w.cached_tokens / max(1, req.prompt_tokens) for w in workers}
        return tie_break(workers, scores)
