"""What one routing decision needs, computed once instead of once per worker.

A decision used to rebuild every candidate's view from its whole ledger and
re-hash the prompt's blocks per worker (tens of microseconds each, so tens of
milliseconds at 256 workers). Now:

- ``PromptBlocks`` hashes the prompt's blocks once per block size per decision,
  and only as far as some worker's held blocks match them (usually one block);
  each worker only walks its held-block set with them.
- ``ViewCache`` keeps each worker's calibrated view without the prompt-specific
  part (``cached_tokens`` = 0) and rebuilds it only when its inputs changed:
  the worker's ``version`` (bumped by the router on assign, relay, heartbeat and
  finish) or the calibration's ``version`` (bumped when rates or the decode
  ratio may have moved). A view's backlog sums are computed once per rebuild
  (``WorkerView.backlog``), so pricing a worker is flat in its in-flight count.
- The candidate list is kept across decisions (``_Pool``): a decision rebuilds
  the entries of the workers whose ``version`` moved, and checks the prompt's
  first block against every worker's held set in C; only the workers holding it
  walk their chain. At 256 workers a decision visits a few workers in Python,
  not every one.
- A view is built only when a decision asks for the candidates (``offered``):
  when exactly one worker has room and the request fits it (``sole``), a policy
  that takes any lone candidate needs none, and the router builds none.

The views that reach the policies are equal, field for field, to the ones built
from scratch (tests/unit/test_decision_replay.py replays recorded decisions).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import compress, repeat
from operator import attrgetter, contains, is_, ne
from typing import cast

from tandem.broker.calibration import Calibration
from tandem.broker.policies import WorkerView
from tandem.broker.registry import WorkerState
from tandem.common.blocks import PrefixChain
from tandem.common.pricing import tier_cached


class PromptBlocks:
    """One prompt's chained block hashes, per block size, hashed as far as read."""

    def __init__(self, tokens: Sequence[int]) -> None:
        self.tokens = tokens
        self._by_size: dict[int, PrefixChain] = {}

    def chain(self, block_size: int) -> PrefixChain:
        """The hashes at ``block_size``: a lazy sequence (common/blocks.py)."""
        got = self._by_size.get(block_size)
        if got is None:
            # Workers always leave >= 1 token to compute: the last block must not be it.
            blocks = (len(self.tokens) - 1) // block_size
            got = self._by_size[block_size] = PrefixChain(self.tokens, block_size, blocks)
        return got

    def hashes(self, block_size: int) -> list[int]:
        """Every block hash at ``block_size``."""
        chain = self.chain(block_size)
        return chain.first(len(chain))

    def cached_on(self, w: WorkerState) -> int:
        """Tokens of this prompt ``w``'s prefix cache will match (block-exact)."""
        held = w.cache.held
        if not held:
            return 0
        chain = self.chain(w.info.block_size)
        return tiered(w, chain, chain.matched_tokens(held), w.info.prefill_tok_s)


class ViewCache:
    """Calibrated views of each worker, rebuilt only when something they show changed.

    A worker's view is kept on it (``WorkerState.view_entry``) with the versions it
    was built at: a worker that re-registers is a new WorkerState, with none."""

    def __init__(self, calibration: Calibration) -> None:
        self.calibration = calibration
        self._pool = _Pool()

    def base(self, w: WorkerState) -> WorkerView:
        """``w``'s calibrated view with ``cached_tokens`` = 0."""
        entry = w.view_entry
        cal = self.calibration.version
        if entry is not None and entry[0] == w.version and entry[1] == cal:
            return entry[2]
        raw = w.base_view(live=self.calibration.calibrate)
        view = self.calibration.adjust(raw)
        w.view_entry = (w.version, cal, view)
        return view

    def view(self, w: WorkerState, prompt: PromptBlocks) -> WorkerView:
        """What the policy sees of ``w`` for ``prompt``."""
        base = self.base(w)
        cached = prompt.cached_on(w)
        return base.with_cached(cached)

    def refresh(self, workers: Iterable[WorkerState]) -> None:
        """Bring the pool up to date with ``workers`` (``offered`` and ``sole`` answer
        for the workers of the last refresh)."""
        self._pool.refresh(list(workers), self)

    def candidates(
        self, workers: Iterable[WorkerState], prompt: PromptBlocks, prompt_tokens: int, budget: int
    ) -> list[WorkerView]:
        """``refresh`` with ``workers``, then ``offered``."""
        self.refresh(workers)
        return self.offered(prompt, prompt_tokens, budget)

    def offered(self, prompt: PromptBlocks, prompt_tokens: int, budget: int) -> list[WorkerView]:
        """``view`` of each worker the request fits (``WorkerState.fits``) that has room
        (``inflight_cap``), in their order. The per-decision work is kept off the
        workers that did not change: ``_Pool`` keeps each one's base view across
        decisions, rebuilt for those whose ``version`` moved; what is left per worker
        runs in C (the version list, the prefix check)."""
        pool = self._pool
        pool.build(self)
        out, gaps = pool.fitting(prompt_tokens + budget, budget)
        ws, sizes = pool.workers, pool.block_sizes
        for bs in sizes:
            chain = prompt.chain(bs)
            first = chain.first(1)
            if not first:
                continue  # the prompt is shorter than a block and its last token
            # Most workers hold none of the prompt's first block: one lookup each, in C.
            helds = pool.helds
            for i in compress(range(len(ws)), map(contains, helds, repeat(first[0]))):
                view = out[i]
                if view is not None and (len(sizes) == 1 or ws[i].info.block_size == bs):
                    w, matched = ws[i], chain.matched_tokens(helds[i])
                    out[i] = view.with_cached(tiered(w, chain, matched, view.prefill_rate))
        return [v for v in out if v is not None] if gaps else cast(list[WorkerView], out)

    def sole(self, prompt_tokens: int, budget: int) -> WorkerState | None:
        """The one worker with room, when exactly one has room and the request fits it:
        then ``offered`` would offer it alone, and a policy that takes any lone
        candidate needs no view of it (none is built: with 256 requests in flight on
        it, a view is a copy of 256 loads per decision)."""
        pool = self._pool
        if len(pool.workers) - pool.full != 1:
            return None
        w = pool.workers[pool.room.index(True)]
        return w if w.fits(prompt_tokens, budget) else None


class _Pool:
    """``ViewCache.candidates``' state between decisions: the workers it was given (held
    here, so that no new worker can take a pooled one's ``id``), and for each the
    ``version`` its entry was made at, whether it has room, and its base view (None
    while it has no room, or until ``build`` makes it: ``sole`` needs none).

    A worker's room and view change only with its ``version`` (assign, relay,
    heartbeat, finish all bump it); its context limits come with its ``Ready``; the
    calibration's ``version`` moves every view: then the pool is rebuilt."""

    def __init__(self) -> None:
        self.workers: list[WorkerState] = []
        self.helds: list[set[int]] = []  # each one's ``cache.held`` (one set for life)
        self.versions: list[int] = []
        self.room: list[bool] = []
        self.views: list[WorkerView | None] = []
        self.unbuilt: set[int] = set()  # workers with room whose view is not made yet
        self.full = 0  # how many have no room
        self.calibration = -1
        self.block_sizes: tuple[int, ...] = ()
        # The least n_ctx and max_tokens_limit: a request within both fits every worker.
        self.min_ctx = self.min_limit = 0

    def refresh(self, ws: list[WorkerState], cache: ViewCache) -> _Pool:
        cal = cache.calibration.version
        if (
            cal != self.calibration
            or len(ws) != len(self.workers)
            or not all(map(is_, ws, self.workers))
        ):
            self.workers, self.calibration = ws, cal
            self.versions = [-1] * len(ws)
            self.helds = [w.cache.held for w in ws]
            self.room = [False] * len(ws)
            self.views = [None] * len(ws)
            self.unbuilt.clear()
            self.full = len(ws)
            self.block_sizes = tuple(sorted({w.info.block_size for w in ws}))
            self.min_ctx = min((w.info.n_ctx for w in ws), default=0)
            self.min_limit = min((w.info.max_tokens_limit for w in ws), default=0)
        versions = list(map(_version, ws))
        if versions != self.versions:
            old, room, views, unbuilt = self.versions, self.room, self.views, self.unbuilt
            for i in compress(range(len(ws)), map(ne, versions, old)):
                w = ws[i]
                has_room = len(w.inflight) < w.inflight_cap
                self.full += room[i] - has_room
                room[i], views[i] = has_room, None
                if has_room:
                    unbuilt.add(i)
                else:
                    unbuilt.discard(i)
            self.versions = versions
        return self

    def build(self, cache: ViewCache) -> None:
        """Make the views ``refresh`` left to be made."""
        views, ws = self.views, self.workers
        for i in self.unbuilt:
            views[i] = cache.base(ws[i])
        self.unbuilt.clear()

    def fitting(self, total: int, budget: int) -> tuple[list[WorkerView | None], bool]:
        """A copy of the views (``build`` first), None for the workers a request of
        ``total`` tokens (prompt + ``budget``) does not fit (``WorkerState.fits``);
        whether any is None."""
        if total <= self.min_ctx and budget <= self.min_limit:
            return self.views.copy(), self.full > 0
        # Some worker is smaller than the request (rare): ask each, by the one rule.
        prompt = total - budget
        out = [
            v if w.fits(prompt, budget) else None
            for v, w in zip(self.views, self.workers, strict=True)
        ]
        return out, True


_version = attrgetter("version")


def tiered(w: WorkerState, chain: PrefixChain, matched: int, prefill_tok_s: float) -> int:
    """``matched`` cached tokens on ``w`` as priced: those only in its host-RAM tier
    count as a restore costs (common/pricing.py ``tier_cached``)."""
    device = w.cache.device
    if device is None or not matched:
        return matched
    on_device = chain.matched_tokens(device.held)
    return tier_cached(matched, on_device, prefill_tok_s, w.cache.restore_tok_s)
