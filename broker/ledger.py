"""What one routing decision needs, computed once instead of once per worker.

A decision used to rebuild every candidate's view from its whole ledger and
re-hash the prompt's blocks per worker (tens of microseconds each, so tens of
milliseconds at 256 workers). Now:

- ``PromptBlocks`` hashes the prompt's blocks once per block size per decision;
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
from tandem.common.blocks import block_hashes, matched_tokens


class PromptBlocks:
    """One prompt's chained block hashes, per block size, computed on first use."""

    def __init__(self, tokens: Sequence[int]) -> None:
        self.tokens = tokens
        self._by_size: dict[int, list[int]] = {}

    def hashes(self, block_size: int) -> list[int]:
        got = self._by_size.get(block_size)
        if got is None:
            # Workers always leave >= 1 token to compute: the last block must not be it.
            usable = (len(self.tokens) - 1) // block_size * block_size
            got = self._by_size[block_size] = block_hashes(self.tokens[:usable], block_size)
        return got

    def cached_on(self, w: WorkerState) -> int:
        """Tokens of this prompt ``w``'s prefix cache will match (block-exact)."""
        held = w.cache.held
        if not held:
            return 0
        bs = w.info.block_size
        hashes = self.hashes(bs)
        if not hashes or hashes[0] not in held:  # the usual case: no prefix in common
            return 0
        return matched_tokens(hashes, held, bs)


class ViewCache:
    """Calibrated views of each worker, rebuilt only when something they show changed."""

    def __init__(self, calibration: Calibration) -> None:
        self.calibration = calibration
        # worker id -> (the WorkerState, its version, calibration version, view)
        self._views: dict[str, tuple[WorkerState, int, int, WorkerView]] = {}

    def base(self, w: WorkerState) -> WorkerView:
        """``w``'s calibrated view with ``cached_tokens`` = 0."""
        entry = self._views.get(w.id)
        cal = self.calibration.version
        if entry is not None and entry[0] is w and entry[1] == w.version and entry[2] == cal:
            return entry[3]
        raw = w.base_view(live=self.calibration.calibrate)
        view = self.calibration.adjust(raw)
        if view is not raw and view.active is raw.active and view.queued is raw.queued:
            view.__dict__["backlog"] = raw.backlog  # same loads: keep the running totals
        self._views[w.id] = (w, w.version, cal, view)
        return view

    def view(self, w: WorkerState, prompt: PromptBlocks) -> WorkerView:
        """What the policy sees of ``w`` for ``prompt``."""
        base = self.base(w)
        cached = prompt.cached_on(w)
        return base.with_cached(cached)

    def views(self, workers: Iterable[WorkerState], prompt: PromptBlocks) -> list[WorkerView]:
        """``view`` of each of ``workers``: the per-decision loop, kept to a few
        lookups per worker (it runs once per worker per request). Most workers hold
        none of the prompt's first block: that is checked here, before any call."""
        cal, cache, out = self.calibration.version, self._views, []
        firsts: dict[int, int | None] = {}  # block size -> the prompt's first block hash
        for w in workers:
            entry = cache.get(w.id)
            if entry is None or entry[0] is not w or entry[1] != w.version or entry[2] != cal:
                base = self.base(w)
            else:
                base = entry[3]
            held = w.cache.held
            if held:
                bs = w.info.block_size
                if bs not in firsts:
                    hashes = prompt.hashes(bs)
                    firsts[bs] = hashes[0] if hashes else None
                if firsts[bs] in held:
                    base = base.with_cached(prompt.cached_on(w))
            out.append(base)
        return out

    def forget(self, worker_id: str) -> None:
        self._views.pop(worker_id, None)
