"""The worker's prefix cache index: which token prefixes have KV kept, and for how long.

Pure Python and backend-agnostic: an entry holds an opaque ``handle`` (a llama.cpp
sequence id, an MLX KV cache) that the backend knows how to copy from and free.

Invariants:
- Matching is at block granularity and leaves at least one prompt token to
  compute (a request needs logits for its last prompt token), so the router's
  estimate from advertised block hashes equals what ``match`` returns.
- Every entry's full-block hashes are in ``log`` exactly once per entry; the
  router learns additions and removals from it.
- Pinned entries are never evicted; eviction is least-recently-used first.
- ``tokens_held`` (sum of entry lengths) never exceeds ``capacity_tokens`` after
  ``insert`` returns; it over-counts KV that entries share, so it is conservative.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tandem.common.blocks import CacheLog, block_hashes


@dataclass
class Entry:
    id: int
    tokens: list[int]
    hashes: list[int]
    handle: Any
    pins: int = 0
    last_used: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class Match:
    entry: Entry | None
    n_tokens: int  # block-aligned, < len(prompt)


class PrefixCache:
    def __init__(self, block_size: int, capacity_tokens: int, max_entries: int) -> None:
        if block_size < 1 or capacity_tokens < 0 or max_entries < 0:
            raise ValueError("block_size >= 1, capacity_tokens >= 0, max_entries >= 0")
        self.block_size = block_size
        self.capacity_tokens = capacity_tokens
        self.max_entries = max_entries
        self.entries: dict[int, Entry] = {}
        self.log = CacheLog()
        self._by_hash: dict[int, set[int]] = {}
        self._ids = itertools.count(1)

    @property
    def tokens_held(self) -> int:
        return sum(len(e.tokens) for e in self.entries.values())

    def match(self, prompt: Sequence[int]) -> Match:
        """The longest cached block-aligned prefix of ``prompt`` (most recent entry wins)."""
        usable = (len(prompt) - 1) // self.block_size  # keep >= 1 token to compute
        best: set[int] = set()
        n = 0
        for h in block_hashes(prompt[: usable * self.block_size], self.block_size):
            ids = self._by_hash.get(h)
            if not ids:
                break
            best, n = ids, n + 1
        if n == 0:
            return Match(None, 0)
        entry = max((self.entries[i] for i in best), key=lambda e: e.last_used)
        entry.last_used = time.monotonic()
        return Match(entry, n * self.block_size)

    def insert(self, tokens: Sequence[int], handle: Any) -> tuple[Entry | None, list[Any]]:
        """Keep ``handle`` as the KV of ``tokens``; returns (entry, handles to free).

        The new entry is refused (its own handle comes back to be freed) when an
        existing entry already covers all its blocks, or when it cannot fit even
        after evicting every unpinned entry. Entries it supersedes are dropped.
        """
        hashes = block_hashes(tokens, self.block_size)
        if not hashes or len(tokens) > self.capacity_tokens or self.max_entries == 0:
            return None, [handle]
        covering = self._by_hash.get(hashes[-1], set())
        if any(len(self.entries[i].hashes) >= len(hashes) for i in covering):
            return None, [handle]
        freed = [self._drop(e) for e in self._superseded_by(hashes)]
        freed += self.evict(len(tokens), entries_needed=1)
        if self._free_tokens() < len(tokens) or len(self.entries) >= self.max_entries:
            return None, freed + [handle]
        entry = Entry(next(self._ids), list(tokens), hashes, handle)
        self.entries[entry.id] = entry
        for h in hashes:
            self._by_hash.setdefault(h, set()).add(entry.id)
        self.log.add(hashes)
        return entry, freed

    def evict(self, n_tokens: int, entries_needed: int = 0) -> list[Any]:
        """Evict LRU unpinned entries until ``n_tokens`` fit; returns their handles."""
        freed: list[Any] = []
        by_age = sorted(self.entries.values(), key=lambda e: e.last_used)
        for entry in by_age:
            room = len(self.entries) + entries_needed <= self.max_entries
            if self._free_tokens() >= n_tokens and room:
                break
            if entry.pins == 0:
                freed.append(self._drop(entry))
        return freed

    def evict_one(self) -> Any | None:
        """Evict the least recently used unpinned entry (to make KV room); its handle."""
        unpinned = [e for e in self.entries.values() if e.pins == 0]
        if not unpinned:
            return None
        return self._drop(min(unpinned, key=lambda e: e.last_used))

    def pin(self, entry: Entry) -> None:
        entry.pins += 1

    def unpin(self, entry: Entry) -> None:
        if entry.pins <= 0:
            raise RuntimeError(f"entry {entry.id} unpinned more often than pinned")
        entry.pins -= 1

    def clear(self) -> list[Any]:
        return [self._drop(e) for e in list(self.entries.values()) if e.pins == 0]

    def _free_tokens(self) -> int:
        return self.capacity_tokens - self.tokens_held

    def _superseded_by(self, hashes: list[int]) -> list[Entry]:
        """Unpinned entries whose blocks are a strict prefix of ``hashes``."""
        out = []
        for i, h in enumerate(hashes):
            for eid in self._by_hash.get(h, ()):
                e = self.entries[eid]
                if len(e.hashes) == i + 1 and e.pins == 0:
                    out.append(e)
        return out

    def _drop(self, entry: Entry) -> Any:
        del self.entries[entry.id]
        for h in entry.hashes:
            ids = self._by_hash[h]
            ids.discard(entry.id)
            if not ids:
                del self._by_hash[h]
        self.log.remove(entry.hashes)
        return entry.handle
