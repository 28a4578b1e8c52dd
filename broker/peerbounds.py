"""What one worker may make the router hold: its cache listing, within what it declares.

A worker's prefix-cache report (common/blocks.py) lists block hashes the router
keeps for routing. A worker can hold at most its declared capacity: the KV cells
of its context plus its prefix cache's tiers, in blocks (each heartbeat says
them), and never more than MAX_CACHE_BLOCKS (a list longer than that is refused
by the decoder), whatever it declares. A report that
would list more is refused whole (the last good listing stays), counted as an
``over_capacity`` rejected frame, and a full resync is asked: a worker that sent
100,000 new hashes every 50 ms grew the router by gigabytes before this bound
(docs/results/reliability.md). docs/SECURITY.md lists the bounds.
"""

from __future__ import annotations

from tandem.common import protocol as p
from tandem.common.blocks import CacheView
from tandem.common.validation import MAX_CACHE_BLOCKS  # whatever a worker declares


def cache_limit_blocks(hb: p.Heartbeat, block_size: int) -> int:
    """The blocks ``hb``'s worker can hold: its KV cells and cache tiers, in blocks."""
    tokens = hb.kv_capacity_tokens
    tiers = hb.cache.tiers
    if tiers is not None:
        tokens += tiers.cache_capacity_tokens + tiers.host_cache_capacity_tokens
    return min(MAX_CACHE_BLOCKS, tokens // max(1, block_size) + 1)


def cache_overflow(view: CacheView, report: p.CacheReport, limit: int) -> int | None:
    """How many blocks ``report`` would make ``view`` list when that is past ``limit``
    (its device tier's report included), else None."""
    n = view.size_after(report)
    if n > limit:
        return n
    if report.device is not None:
        device = view.device if view.device is not None else CacheView()
        return cache_overflow(device, report.device, limit)
    return None
