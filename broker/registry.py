"""The router's view of its workers: registration, heartbeats, ledger, liveness.

A worker's load as the router sees it = its last heartbeat, corrected by the
router's own ledger: requests the router assigned that the heartbeat does not
list yet are added, requests that finished since are dropped, and decode budgets
shrink with the tokens the router has relayed. Bursts faster than heartbeats
therefore do not all see the same stale state.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from tandem.broker.calibration import PROGRESS_EVERY, PROGRESS_FIRST
from tandem.broker.policies import Load, WorkerView
from tandem.common import protocol as p
from tandem.common.blocks import CacheView, block_hashes, matched_tokens
from tandem.common.tokenizer import TokenizerSpec


@dataclass
class Routed:
    """What the router remembers about one request it assigned to a worker."""

    wid: str  # worker-side request id
    worker_id: str
    prompt_tokens: int
    max_tokens: int
    cached_estimate: int
    prefill_only: bool
    tokens_seen: int = 0
    next_sample: int = PROGRESS_FIRST  # relayed tokens at which calibration samples it next

    def relayed(self, n_tokens: int) -> bool:
        """Count ``n_tokens`` relayed; True when calibration should sample it now."""
        self.tokens_seen += n_tokens
        if self.tokens_seen < self.next_sample:
            return False
        self.next_sample = self.tokens_seen + PROGRESS_EVERY
        return True

    def load(self, reported: dict[str, Any] | None, queued: bool = False) -> Load:
        """This request's remaining work: the heartbeat's numbers, or the ledger's.

        ``queued``: the heartbeat lists it as queued. The worker matches its prefix
        cache only at admission, so until then the request keeps the cache discount
        it was routed with; once active, the worker's own numbers hold (even a miss).
        """
        budget = 0 if self.prefill_only else self.max_tokens - self.tokens_seen
        if reported is None:  # not in a heartbeat yet: keep what routing assumed
            return Load(self.prompt_tokens - self.cached_estimate, budget)
        prefill = int(reported.get("prefill_remaining", 0))
        if queued:
            prefill -= self.cached_estimate
        return Load(max(0, prefill), max(0, min(int(reported.get("decode_remaining", 0)), budget)))


@dataclass
class WorkerState:
    identity: bytes
    info: p.Ready
    last_seen: float = field(default_factory=time.monotonic)
    heartbeat: p.Heartbeat | None = None
    cache: CacheView = field(default_factory=CacheView)
    inflight: dict[str, Routed] = field(default_factory=dict)  # by worker-side id
    routed_total: int = 0

    @property
    def id(self) -> str:
        return self.info.worker_id

    def liveness_s(self, floor_s: float) -> float:
        return max(floor_s, 6 * self.info.heartbeat_s)

    def cached_for(self, tokens: list[int]) -> int:
        """Tokens of ``tokens`` this worker's prefix cache will match (block-exact)."""
        bs = self.info.block_size
        usable = (len(tokens) - 1) // bs * bs  # workers always leave >= 1 token to compute
        return matched_tokens(block_hashes(tokens[:usable], bs), self.cache.held, bs)

    def view(self, tokens: list[int]) -> WorkerView:
        """The policy's view of this worker for a prompt of ``tokens``."""
        hb = self.heartbeat
        reported = {}
        listed_active: set[str] = set()
        if hb is not None:
            reported = {r.get("id"): r for r in hb.active + hb.queued}
            listed_active = {r.get("id") for r in hb.active}
        active, queued = [], []
        for wid, routed in self.inflight.items():
            load = routed.load(reported.get(wid), queued=wid not in listed_active)
            (active if wid in listed_active else queued).append(load)
        return WorkerView(
            id=self.id,
            prefill_rate=self.info.prefill_tok_s,
            decode_rates=tuple(self.info.decode_tok_s),
            max_active=self.info.max_active,
            device=self.info.device,
            cached_tokens=self.cached_for(tokens),
            active=tuple(active),
            queued=tuple(queued),
        )

    def fits(self, prompt_tokens: int, max_tokens: int) -> bool:
        return (
            prompt_tokens + max_tokens <= self.info.n_ctx
            and max_tokens <= self.info.max_tokens_limit
        )

    def describe(self) -> dict[str, Any]:
        """One row of `tandem status`."""
        hb = self.heartbeat
        return {
            "id": self.id,
            "backend": self.info.backend,
            "device": self.info.device,
            "model": self.info.model,
            "max_active": self.info.max_active,
            "active": len(hb.active) if hb else 0,
            "queued": len(hb.queued) if hb else 0,
            "inflight": len(self.inflight),
            "routed_total": self.routed_total,
            "kv_used_tokens": hb.kv_used_tokens if hb else 0,
            "kv_capacity_tokens": hb.kv_capacity_tokens if hb else self.info.n_ctx,
            "cached_blocks": len(self.cache.held),
            "block_size": self.info.block_size,
            "prefill_tok_s": self.info.prefill_tok_s,
            "decode_tok_s": list(self.info.decode_tok_s),
            "last_seen_s": round(time.monotonic() - self.last_seen, 3),
            "requests": hb.active + hb.queued if hb else [],
        }


def ready_problem(
    ready: p.Ready, model: str | None, have_tokenizer: bool, weights: str = ""
) -> str | None:
    """Why the router refuses this Ready (``model`` / ``weights``: the name and weights
    digest it already serves), or None. Digests decide when both sides have one, so a
    GGUF and its converted MLX folder match while two files named alike do not."""
    if model is not None and weights and ready.weights:
        if ready.weights != weights:
            return (
                f"different weights: this router serves {model!r} (weights {weights}); "
                f"worker has {ready.model!r} (weights {ready.weights})"
            )
    elif model is not None and ready.model != model:
        return f"this router serves {model!r}; worker has {ready.model!r}"
    if ready.max_active < 1 or ready.n_ctx < 1 or ready.block_size < 1:
        return "max_active, n_ctx and block_size must be >= 1"
    if ready.prefill_tok_s <= 0 or not ready.decode_tok_s or min(ready.decode_tok_s) <= 0:
        return "rates must be positive"
    if not have_tokenizer:  # the first worker's tokenizer becomes the router's
        try:
            TokenizerSpec.from_wire(ready.tokenizer)
        except (ValueError, KeyError, TypeError) as exc:
            return f"unusable tokenizer: {exc}"
    return None
