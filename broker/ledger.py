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

The views that reach the policies are equal, field for field, to the ones built
from scratch (tests/unit/test_decision_replay.py replays recorded decisions).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tandem.broker.calibration import Calibration
from tandem.broker.policies import WorkerView
from tandem.broker.registry import WorkerState
from tandem.common.blocks import PrefixChain


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
        return self.chain(w.info.block_size).matched_tokens(held)


class ViewCache:
    """Calibrated views of each worker, rebuilt only when something they show changed.

    A worker's view is kept on it (``WorkerState.view_entry``) with the versions it
    was built at: a worker that re-registers is a new WorkerState, with none."""

    def __init__(self, calibration: Calibration) -> None:
        self.calibration = calibration

    def base(self, w: WorkerState) -> WorkerView:
        """``w``'s calibrated view with ``cached_tokens`` = 0."""
        entry = w.view_entry
        cal = self.calibration.version
        if entry is not None and entry[0] == w.version and entry[1] == cal:
            return entry[2]
        raw = w.base_view(live=self.calibration.calibrate)
        view = self.calibration.adjust(raw)
        if view is not raw and view.active is raw.active and view.queued is raw.queued:
            view.__dict__["backlog"] = raw.backlog  # same loads: keep the running totals
        w.view_entry = (w.version, cal, view)
        return view

    def view(self, w: WorkerState, prompt: PromptBlocks) -> WorkerView:
        """What the policy sees of ``w`` for ``prompt``."""
        base = self.base(w)
        cached = prompt.cached_on(w)
        return base.with_cached(cached)

    def candidates(
        self, workers: Iterable[WorkerState], prompt: PromptBlocks, prompt_tokens: int, budget: int
    ) -> list[WorkerView]:
        """``view`` of each of ``workers`` the request fits (``WorkerState.fits``) that
        has room (``inflight_cap``): the per-decision loop, kept to a few lookups per
        worker (it runs once per worker per request). Most workers hold none of the
        prompt's first block: that is checked here, before any call."""
        cal, out = self.calibration.version, []
        total = prompt_tokens + budget
        firsts: dict[int, int | None] = {}  # block size -> the prompt's first block hash
        for w in workers:
            info = w.info
            # WorkerState.fits, inlined: 256 calls cost more than the rest of this loop.
            if total > info.n_ctx or budget > info.max_tokens_limit:
                continue
            if len(w.inflight) >= w.inflight_cap:
                continue
            entry = w.view_entry
            if entry is None or entry[0] != w.version or entry[1] != cal:
                base = self.base(w)
            else:
                base = entry[2]
            held = w.cache.held
            if held:
                bs = info.block_size
                if bs not in firsts:
                    first = prompt.chain(bs).first(1)
                    firsts[bs] = first[0] if first else None
                if firsts[bs] in held:
                    base = base.with_cached(prompt.cached_on(w))
            out.append(base)
        return out
