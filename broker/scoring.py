"""Token-aware policies: phase_cost (the default), least_tokens and cache_aware.

``phase_cost`` prices the two phases separately, because devices differ most in
prefill (a GPU is ~30x a CPU) and least in decode (a few x):

    score(w) = P(w) / prefill_rate(w) + D(w) / decode_rate(w)

P(w): prefill tokens still to compute on w (each active and queued request's
remaining prompt tokens after its cache discount) plus the new prompt's tokens
that w does not already cache. D(w): decode tokens still to produce on w (each
request's unused budget) plus the new request's budget. The decode rate is w's
aggregate rate at the batch size it would run with the new request added.

``state_from_json`` reads the STATE.json of ``tandem route explain`` into the
same ``RouteRequest`` / ``WorkerView`` objects the router builds, so an
explanation runs exactly the code the live router runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from broker.policy import Decision, Load, RouteRequest, WorkerView, _tie_break


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
    backlog = w.active + w.queued
    # A worker always computes >= 1 prompt token (it needs the last token's logits),
    # so even a fully cached prompt costs one token.
    new_prefill = max(1, req.prompt_tokens - w.cached_tokens)
    p = sum(x.prefill_remaining for x in backlog) + new_prefill
    d = sum(x.decode_remaining for x in backlog) + req.max_tokens
    batch = min(w.max_active, w.n_requests + 1)
    return Terms(p, d, w.prefill_rate, w.decode_rate(batch))


class PhaseCost:
    """Seconds of work ahead of the request on each worker (the issue's cost model)."""

    name = "phase_cost"

    def choose(self, req: RouteRequest, workers: list[WorkerView]) -> Decision:
        return _tie_break(workers, {w.id: phase_terms(req, w).seconds for w in workers})


class LeastTokens:
    """Fewest outstanding P + D tokens, ignoring how fast each worker is."""

    name = "least_tokens"

    def choose(self, req: RouteRequest, workers: list[WorkerView]) -> Decision:
        scores = {}
        for w in workers:
            t = phase_terms(req, w)
            scores[w.id] = float(t.prefill_tokens + t.decode_tokens)
        return _tie_break(workers, scores)


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
            return _tie_break(workers, {w.id: float(w.n_requests) for w in workers})
        # Score: uncached fraction of the prompt; ties fall back to load, then id.
        scores = {w.id: 1.0 - w.cached_tokens / max(1, req.prompt_tokens) for w in workers}
        return _tie_break(workers, scores)


POLICIES: dict[str, type] = {
    "phase_cost": PhaseCost,
    "least_tokens": LeastTokens,
    "cache_aware": CacheAware,
}


# ------------------------------------------------------------ STATE.json
def state_from_json(state: Any) -> tuple[RouteRequest, list[WorkerView]]:
    """Parse a ``tandem route explain`` STATE document; ValueError says what is wrong.

    ``{"request": {"prompt_tokens", "max_tokens"}, "workers": [{"id",
    "prefill_rate", "decode_rate", "cached_tokens"?, "max_active"?, "device"?,
    "active"?: [{"prefill_remaining", "decode_remaining"}], "queued"?: [...]}]}``.
    ``decode_rate`` is one number or a list of aggregate tok/s by batch size
    (then ``max_active`` defaults to its length, else to 4).
    """
    if not isinstance(state, dict):
        raise ValueError("STATE must be a JSON object with 'request' and 'workers'")
    r = _obj(state.get("request"), "request")
    req = RouteRequest(_int(r, "prompt_tokens", "request", lo=1), _int(r, "max_tokens", "request"))
    workers = state.get("workers")
    if not isinstance(workers, list) or not workers:
        raise ValueError("'workers' must be a non-empty list")
    views = [_worker_view(_obj(w, f"workers[{i}]"), f"workers[{i}]") for i, w in enumerate(workers)]
    ids = [v.id for v in views]
    if len(set(ids)) != len(ids):
        raise ValueError(f"worker ids must be unique, got {ids}")
    return req, views


def _worker_view(w: dict[str, Any], where: str) -> WorkerView:
    wid = w.get("id")
    if not isinstance(wid, str) or not wid:
        raise ValueError(f"{where}.id must be a non-empty string")
    prefill = _rate(w.get("prefill_rate"), f"{where}.prefill_rate")
    raw = w.get("decode_rate")
    if isinstance(raw, list):
        if not raw:
            raise ValueError(f"{where}.decode_rate must not be empty")
        decode = tuple(_rate(x, f"{where}.decode_rate") for x in raw)
    else:
        decode = (_rate(raw, f"{where}.decode_rate"),)
    return WorkerView(
        id=wid,
        prefill_rate=prefill,
        decode_rates=decode,
        max_active=_int(
            w, "max_active", where, default=len(decode) if len(decode) > 1 else 4, lo=1
        ),
        device=str(w.get("device", "")),
        cached_tokens=_int(w, "cached_tokens", where, default=0),
        active=_loads(w.get("active", []), f"{where}.active"),
        queued=_loads(w.get("queued", []), f"{where}.queued"),
    )


def _loads(items: Any, where: str) -> tuple[Load, ...]:
    if not isinstance(items, list):
        raise ValueError(f"{where} must be a list")
    out = []
    for i, item in enumerate(items):
        x = _obj(item, f"{where}[{i}]")
        p = _int(x, "prefill_remaining", f"{where}[{i}]", default=0)
        out.append(Load(p, _int(x, "decode_remaining", f"{where}[{i}]", default=0)))
    return tuple(out)


def _obj(x: Any, where: str) -> dict[str, Any]:
    if not isinstance(x, dict):
        raise ValueError(f"{where} must be an object")
    return x


def _int(d: dict[str, Any], key: str, where: str, default: int | None = None, lo: int = 0) -> int:
    v = d.get(key, default)
    if v is None:
        raise ValueError(f"{where}.{key} is required")
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if not isinstance(v, int) or isinstance(v, bool) or v < lo:
        raise ValueError(f"{where}.{key} must be an integer >= {lo}, got {v!r}")
    return v


def _rate(v: Any, where: str) -> float:
    if not isinstance(v, int | float) or isinstance(v, bool) or not v > 0:
        raise ValueError(f"{where} must be a positive number (tok/s), got {v!r}")
    return float(v)
