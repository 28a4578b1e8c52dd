"""The router's view of its workers: registration, heartbeats, ledger, liveness.

A worker's load as the router sees it = its last heartbeat, corrected by the
router's own ledger: requests the router assigned that the heartbeat does not
list yet are added, requests that finished since are dropped, and decode budgets
shrink with the tokens the router has relayed. Bursts faster than heartbeats
therefore do not all see the same stale state.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from tandem.broker.loads import Loads
from tandem.broker.observed import Served
from tandem.broker.policies import Load, WorkerView
from tandem.common import protocol as p
from tandem.common.blocks import CacheView, block_hashes, matched_tokens
from tandem.common.pricing import Rates, price
from tandem.common.steptime import StepModel
from tandem.common.tokenizer import TokenizerSpec

NOTED_PERIODS = 2  # a finished prompt counts as cached this many heartbeats unreported
# A provisional Ready (a stored profile, a quick start-up measurement) is borne out once
# the live model holds this many served decode steps; until then status, top and
# /metrics say "provisional". A provisional rate this far off the live one is not used.
TRUSTED_STEPS = 32
FAR_FROM_LIVE = 3.0
MAX_CLAIMS = 64  # pending claims on held worker ids remembered (the oldest go first)


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
    # The prompt's block hashes at this worker's block size (computed for routing
    # anyway): noted as cached there when it finishes (common.blocks.CacheView.note).
    blocks: Sequence[int] = ()

    def load(self, reported: p.RequestRow | None, queued: bool = False) -> Load:
        """This request's remaining work: the heartbeat's numbers, or the ledger's.

        ``queued``: the heartbeat lists it as queued. The worker matches its prefix
        cache only at admission, so until then the request keeps the cache discount
        it was routed with; once active, the worker's own numbers hold (even a miss).
        """
        budget = 0 if self.prefill_only else self.max_tokens - self.tokens_seen
        if reported is None:  # not in a heartbeat yet: keep what routing assumed
            return Load(self.prompt_tokens - self.cached_estimate, budget)
        # The worker's word, held to what the router knows: no more than the prompt.
        prefill = min(reported.prefill_remaining, self.prompt_tokens)
        if self.tokens_seen:  # it already produced tokens: its prefill is over, whatever
            prefill = 0  # a heartbeat sent before that still says
        elif queued:
            prefill -= self.cached_estimate
        return Load(max(0, prefill), max(0, min(reported.decode_remaining, budget)))


@dataclass
class WorkerState:
    identity: bytes
    info: p.Ready
    last_seen: float = 0.0  # the router's clock at its last heartbeat (the driver's time)
    heartbeat: p.Heartbeat | None = None
    cache: CacheView = field(default_factory=CacheView)
    inflight: dict[str, Routed] = field(default_factory=dict)  # by worker-side id
    routed_total: int = 0
    # Bumped by the router whenever anything base_view() reads changes (an assign,
    # relayed tokens, a heartbeat, a finish, a new step model): broker/ledger.py
    # caches views by it.
    version: int = 0
    loads: Loads = field(default_factory=Loads)  # the ledger as Loads, kept by the router
    steps: StepModel | None = None  # the worker's live step-time model, last one received
    _rates: dict[bool, Rates] = field(default_factory=dict)  # by "live": dropped on new steps
    _claims: dict[bool, Rates] = field(default_factory=dict)  # the same, before ``served``
    served: Served = field(default_factory=Served)  # its claims against its tokens (observed.py)
    # Requests the router lets it hold (Admission.inflight_cap, set on registration).
    inflight_cap: int = 1 << 62
    # (version, calibration version, view): its last view, kept by broker/ledger.py.
    view_entry: tuple[int, int, WorkerView] | None = None

    @property
    def id(self) -> str:
        return self.info.worker_id

    # ------------------------------------------------------------ ledger events
    # Each keeps ``loads`` current and bumps ``version`` (cached views key on it).
    def track(self, routed: Routed) -> None:
        """``routed`` was assigned here: its prompt blocks count as cached here for the
        requests routed after it (the worker computes them once for all)."""
        if routed.wid in self.inflight:  # re-tracked (a move): its blocks are held already
            self.cache.release(self.inflight[routed.wid].blocks)
        self.inflight[routed.wid] = routed
        self.cache.hold(routed.blocks)
        if self.loads.moves(routed.wid, routed):  # its first tokens: now active
            self.loads.rebuild(self.inflight, self.heartbeat)
        else:
            self.loads.set(routed.wid, routed)
        self.version += 1

    def progressed(self, wid: str) -> None:
        """``wid`` had tokens relayed (its decode budget shrank)."""
        self.loads.touch(wid)
        self.version += 1

    def untrack(self, wid: str) -> None:
        """``wid`` finished, was cancelled or lost."""
        routed = self.inflight.pop(wid, None)
        if routed is not None:
            self.cache.release(routed.blocks)
            if routed.tokens_seen:
                self.served.decoding -= 1
        if not self.inflight:
            self.served.idle = True  # from some time since its last event: not counted
        self.loads.drop(wid)
        self.version += 1

    def finished(self, wid: str, now: float) -> None:
        """``wid`` ended with a Done (call before ``untrack``): its prompt is in this
        worker's prefix cache now, whatever the last heartbeat said (two heartbeat
        periods to say otherwise)."""
        routed = self.inflight.get(wid)
        if routed is not None and routed.blocks:
            self.cache.note(routed.blocks, now + NOTED_PERIODS * self.info.heartbeat_s)

    def on_heartbeat(self, hb: p.Heartbeat) -> None:
        self.heartbeat = hb
        self.loads.rebuild(self.inflight, hb)
        self.version += 1

    def liveness_s(self, floor_s: float) -> float:
        return max(floor_s, 6 * self.info.heartbeat_s)

    def cached_for(self, tokens: list[int], hashes: dict[int, list[int]] | None = None) -> int:
        """Tokens of ``tokens`` this worker's prefix cache will match (block-exact).
        ``hashes``: block hashes of ``tokens`` by block size, shared between the workers
        of one decision (filled here), so a long prompt is hashed once, not per worker."""
        bs = self.info.block_size
        hashes = {} if hashes is None else hashes
        if bs not in hashes:
            usable = (len(tokens) - 1) // bs * bs  # workers always leave >= 1 token to compute
            hashes[bs] = block_hashes(tokens[:usable], bs)
        return matched_tokens(hashes[bs], self.cache.held, bs)

    def update_steps(self, wire: p.StepReport) -> str | None:
        """Take a heartbeat's step model; returns what is wrong with it, if anything
        (then the last good model stays)."""
        try:
            self.steps = StepModel.from_wire(wire)
        except ValueError as exc:
            return str(exc)
        self._rates.clear()
        self._claims.clear()
        self.version += 1
        return None

    def rates(self, live: bool = True) -> Rates:
        """Prices: its claims (``claimed_rates``), scaled to what it serves when they
        are not borne out (broker/observed.py)."""
        if live not in self._rates:
            self._rates[live] = self.served.priced(self.claimed_rates(live))
        return self._rates[live]

    def claimed_rates(self, live: bool = True) -> Rates:
        """Its word: the profile repaired, with the live step model when ``live``."""
        if live not in self._claims:
            info = self.info
            model = self.steps if live else None
            prior = info.decode_tok_s
            if info.provisional and model is not None:
                prior = checked_prior(prior, model)
            steps = [b for b in info.decode_steps if b <= info.max_active]
            self._claims[live] = price(
                info.prefill_tok_s, prior, info.max_active, model, steps=steps
            )
        return self._claims[live]

    def served_work(
        self, now: float, busy_since: float | None, tokens: tuple[int, int, int], live: bool
    ) -> None:
        """Relayed at ``now``: ``tokens`` = (decode tokens of rows already decoding,
        uncached prompt tokens of requests that gave their first token, how many
        did); ``busy_since``: when it went busy, if it was idle (broker/observed.py)."""
        decode_tokens, prompt_tokens, firsts = tokens
        s = self.served
        s.elapse(now, busy_since)
        claimed = self.claimed_rates(live)
        rows = min(max(1, s.decoding), len(claimed.decode_tok_s))
        work_s = decode_tokens / claimed.decode_tok_s[rows - 1]
        if s.credit(work_s + prompt_tokens / claimed.prefill_tok_s):
            self._rates.clear()  # repriced (or no longer): views key on ``version``
            self.version += 1
        s.decoding += firsts
        s.settle(now, bool(self.inflight))

    @property
    def live_steps(self) -> int:
        """Decode steps its live step model has seen."""
        return sum(self.steps.decode_samples) if self.steps is not None else 0

    @property
    def provisional(self) -> bool:
        """Priced on a word its served steps have not yet borne out (``TRUSTED_STEPS``)."""
        return self.info.provisional and self.live_steps < TRUSTED_STEPS

    def view(
        self, tokens: list[int], live: bool = True, hashes: dict[int, list[int]] | None = None
    ) -> WorkerView:
        """The policy's view of this worker for a prompt of ``tokens``, built from
        scratch: a walk of the whole ledger (the router uses ``base_view``). ``live``:
        priced with its step-time model, else with its repaired profile alone;
        ``hashes``: see ``cached_for``."""
        hb = self.heartbeat
        reported = {}
        listed_active: set[str] = set()
        if hb is not None:
            reported = {r.id: r for r in hb.active + hb.queued}
            listed_active = {r.id for r in hb.active}
        active: list[Load] = []
        queued: list[Load] = []
        for wid, routed in self.inflight.items():
            # Tokens relayed prove a request active even if the last heartbeat (older
            # than they are) listed it as queued.
            is_active = wid in listed_active or routed.tokens_seen > 0
            load = routed.load(reported.get(wid), queued=not is_active)
            (active if is_active else queued).append(load)
        cached = self.cached_for(tokens, hashes)
        return self._view(tuple(active), tuple(queued), cached, live)

    def base_view(self, live: bool = True) -> WorkerView:
        """This worker's view before any prompt (``cached_tokens`` 0), from ``loads``:
        no walk of the ledger, totals included."""
        self.loads.settle(self.inflight)
        loads = self.loads
        totals = (loads.prefill_total, loads.decode_total)
        active, queued = tuple(loads.active.values()), tuple(loads.queued.values())
        return self._view(active, queued, 0, live, totals)

    def _view(
        self,
        active: tuple[Load, ...],
        queued: tuple[Load, ...],
        cached: int,
        live: bool,
        backlog: tuple[int, int] | None = None,
    ) -> WorkerView:
        rates = self.rates(live)
        return WorkerView(
            id=self.id,
            prefill_rate=rates.prefill_tok_s,
            decode_rates=rates.decode_tok_s,
            max_active=self.info.max_active,
            device=self.info.device,
            cached_tokens=cached,
            active=active,
            queued=queued,
            decode_context=rates.context,
            decode_context_s=rates.context_s,
            prefill_by_chunk=rates.prefill_by_chunk,
            step_tokens=self.info.step_tokens,
            backlog=backlog,
        )

    def fits(self, prompt_tokens: int, max_tokens: int) -> bool:
        # broker/ledger.py _Pool.fitting skips this call when the request fits the
        # smallest n_ctx and max_tokens_limit of all workers: keep the two in step.
        return (
            prompt_tokens + max_tokens <= self.info.n_ctx
            and max_tokens <= self.info.max_tokens_limit
        )

    def describe(self, live: bool, now: float) -> dict[str, Any]:
        """One row of `tandem status`: the profile, the live model, what routing prices
        (``now``: the router's clock, as its driver passes it)."""
        hb = self.heartbeat
        rates = self.rates(live)
        return {
            "id": self.id,
            "backend": self.info.backend,
            "device": self.info.device,
            "node": self.info.node,
            "model": self.info.model,
            "max_active": self.info.max_active,
            "n_ctx": self.info.n_ctx,
            "capabilities": sorted(self.info.capabilities),
            "active": len(hb.active) if hb else 0,
            "queued": len(hb.queued) if hb else 0,
            "inflight": len(self.inflight),
            "routed_total": self.routed_total,
            "kv_used_tokens": hb.kv_used_tokens if hb else 0,
            "kv_capacity_tokens": hb.kv_capacity_tokens if hb else self.info.n_ctx,
            "cached_blocks": len(self.cache.held),
            "host_blocks": self.cache.host_blocks(),  # of them, held only in host RAM
            **self.cache.tiers,  # the prefix cache's tiers (common/blocks.py TIER_KEYS)
            "block_size": self.info.block_size,
            "prefill_tok_s": self.info.prefill_tok_s,
            "decode_tok_s": list(self.info.decode_tok_s),
            "live_prefill_tok_s": _rounded(rates.live_prefill_tok_s),
            "live_decode_tok_s": [_rounded(x) for x in rates.live_decode_tok_s],
            "live_decode_samples": list(rates.live_decode_samples),
            "live_context_tokens": round(rates.context, 1),
            "live_context_s": float(f"{rates.context_s:.3g}"),
            "provisional": self.provisional,
            "live_steps": self.live_steps,
            "priced_prefill_tok_s": round(rates.prefill_tok_s, 2),
            "priced_decode_tok_s": [round(x, 2) for x in rates.decode_tok_s],
            "profile_repaired": list(rates.repaired),
            "served": self.served.describe(),
            "last_seen_s": round(now - self.last_seen, 3),
            "requests": [msgspec.structs.asdict(r) for r in hb.active + hb.queued] if hb else [],
        }


def checked_prior(prior: Sequence[float], model: StepModel) -> list[float]:
    """A provisional ``prior`` checked against the live steps: when a rate at a batch
    size with live samples is more than FAR_FROM_LIVE off them (a start-up measurement
    taken in a stall), the prior keeps only its shape, its level taken from the live
    rates (their factor at each sampled size, interpolated in log space between them,
    the nearest one's past either end); ``price`` then blends as usual."""
    out = [float(x) for x in prior]
    logf = {
        b: math.log(rate / out[b - 1])
        for b, (rate, _) in model.decode_tok_s().items()
        if b <= len(out)
    }
    if all(abs(f) <= math.log(FAR_FROM_LIVE) for f in logf.values()):
        return out
    for b in range(1, len(out) + 1):
        lo = max((s for s in logf if s <= b), default=None)
        hi = min((s for s in logf if s >= b), default=None)
        if lo is not None and hi is not None and lo != hi:
            f = logf[lo] + (logf[hi] - logf[lo]) * (b - lo) / (hi - lo)
        else:  # a measured size, or past either end: the nearest one's
            f = logf[next(s for s in (lo, hi) if s is not None)]
        out[b - 1] *= math.exp(f)
    return out


@dataclass
class Claims:
    """Readies claiming a worker id that another connection holds: when each claimant
    (socket identity) first claimed it. A holder heard from after a claim began is
    alive, so the claimant is a duplicate and is refused, by name; a holder not heard
    from since may be a dead process whose disconnect is not yet noticed, so the
    claimant is left to retry its Ready until the id is free (a restart gets in)."""

    first: dict[bytes, float] = field(default_factory=dict)

    def refusal(self, claimant: bytes, holder: WorkerState, now: float) -> p.Problem | None:
        since = self.first.setdefault(claimant, now)
        while len(self.first) > MAX_CLAIMS:
            del self.first[next(iter(self.first))]
        if holder.last_seen <= since:
            return None
        del self.first[claimant]
        info = holder.info
        return p.Problem.bad_request(
            f"worker id {info.worker_id!r} is taken by a live worker ({info.backend} on "
            f"{info.device}, model {info.model}, instance {info.instance[:8] or '?'}, heard "
            f"{now - holder.last_seen:.1f} s ago): stop that one, or start this one with "
            "another --worker-id"
        )


def _rounded(x: float | None) -> float | None:
    # None for what is not a finite number: one bad row must not make the whole
    # status reply unsendable (its decoder refuses inf and NaN).
    return None if x is None or not math.isfinite(x) else round(x, 2)


def ready_problem(
    ready: p.Ready, model: str | None, have_tokenizer: bool, weights: str = ""
) -> p.Problem | None:
    """Why the router refuses this Ready (``model`` / ``weights``: the name and weights
    digest it already serves), or None. Digests decide when both sides have one, so a
    GGUF and its converted MLX folder match while two files named alike do not."""
    bad = p.Problem.bad_request
    if model is not None and weights and ready.weights:
        if ready.weights != weights:
            return bad(
                f"different weights: this router serves {model!r} (weights {weights}); "
                f"worker has {ready.model!r} (weights {ready.weights})"
            )
    elif model is not None and ready.model != model:
        return bad(f"this router serves {model!r}; worker has {ready.model!r}")
    if ready.max_active < 1 or ready.n_ctx < 1 or ready.block_size < 1:
        return bad("max_active, n_ctx and block_size must be >= 1")
    if ready.prefill_tok_s <= 0 or not ready.decode_tok_s or min(ready.decode_tok_s) <= 0:
        return bad("rates must be positive")
    if not have_tokenizer:  # the first worker's tokenizer becomes the router's
        try:
            TokenizerSpec.from_wire(ready.tokenizer)
        except (ValueError, KeyError, TypeError) as exc:
            return bad(f"unusable tokenizer: {exc}")
        if ready.tokenizer_hash and p.tokenizer_hash(ready.tokenizer) != ready.tokenizer_hash:
            return bad("tokenizer_hash does not match the tokenizer sent with it")
    return None
