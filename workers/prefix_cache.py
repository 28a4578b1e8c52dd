"""The worker's prefix cache index: which token prefixes have KV kept, where, for how long.

Pure Python and backend-agnostic: an entry holds an opaque ``handle`` that the
backend knows how to copy from and free (a llama.cpp sequence id, an MLX KV
cache) while it is on the DEVICE, or a saved state (bytes, arrays) once it was
moved to the HOST tier, which the backend restores instead of prefilling.

Invariants:
- Matching is at block granularity and leaves at least one prompt token to
  compute (a request needs logits for its last prompt token), so the router's
  estimate from advertised block hashes equals what ``match`` returns.
- Every entry's full-block hashes are in ``log`` exactly once per entry, and in
  ``device_log`` once per device-tier entry; the router learns from both.
- Pinned entries are never evicted or moved.
- Each tier's tokens (sum of its entries' lengths) never exceed its capacity after
  ``insert`` returns; the sum over-counts KV that entries share, so it is
  conservative.
- Eviction takes the least valuable unpinned entry (``policy``): "lru" by last
  use; "value" by greedy-dual credit (``credit``): an entry is worth the prefill
  it saved plus its own length, on top of the credit of the last entry evicted,
  so what many requests share or what is long stays longer and an idle entry
  ages out. A device-tier entry evicted with a host tier behind it is moved
  there (``demote`` saves it), and only falls out when the host tier evicts it;
  one whose blocks other entries mostly hold is dropped instead (a save copies
  the whole sequence for the few blocks only it has).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tandem.common import protocol as p
from tandem.common.blocks import CacheLog, block_hashes

DEVICE, HOST = "device", "host"
POLICIES = ("value", "lru")
SAVE_OWN_SHARE = 4  # an evicted entry is saved when it owns >= 1/4 of its blocks


@dataclass
class Entry:
    id: int
    tokens: list[int]
    hashes: list[int]
    handle: Any  # device: the backend's handle; host: its saved state
    tier: str = DEVICE
    pins: int = 0
    last_used: int = 0  # logical time of the last insert or match
    credit: float = 0.0  # "value" eviction: the smallest goes first


@dataclass(frozen=True)
class Match:
    entry: Entry | None
    n_tokens: int  # block-aligned, < len(prompt)


class PrefixCache:
    def __init__(
        self,
        block_size: int,
        capacity_tokens: int,
        max_entries: int,
        *,
        host_capacity_tokens: int = 0,
        demote: Callable[[Any], Any | None] | None = None,
        policy: str = "value",
    ) -> None:
        """``demote(handle)``: the saved state of a device handle (None: cannot save);
        without it, or with no host capacity, evicted entries are dropped."""
        if block_size < 1 or min(capacity_tokens, max_entries, host_capacity_tokens) < 0:
            raise ValueError("block_size >= 1; capacities and max_entries >= 0")
        if policy not in POLICIES:
            raise ValueError(f"cache eviction policy must be one of {POLICIES}, not {policy!r}")
        self.block_size = block_size
        self.capacity = {DEVICE: capacity_tokens, HOST: host_capacity_tokens if demote else 0}
        self.max_entries = max_entries  # device-tier entries (e.g. llama.cpp sequence ids)
        self.policy = policy
        self.demote = demote
        self.entries: dict[int, Entry] = {}
        self.log = CacheLog()  # every tier
        self.device_log = CacheLog()  # the device tier alone
        self.held = {DEVICE: 0, HOST: 0}  # tokens per tier
        self.counts = {DEVICE: 0, HOST: 0}  # entries per tier
        self._by_hash: dict[int, set[int]] = {}
        self._ids = itertools.count(1)
        self._clock = itertools.count(1)
        self._floor = 0.0  # "value": the credit of the last entry evicted (aging)
        self.restore_tok_s = 0.0  # host-tier restores, measured (workers/host_cache.py)
        self.kv_bytes_per_token = 0  # the model's, reported with the tiers (0: unknown)

    @property
    def capacity_tokens(self) -> int:
        return self.capacity[DEVICE]

    @property
    def tokens_held(self) -> int:
        """Device-tier tokens: KV cells the cache keeps (over-counting shared ones)."""
        return self.held[DEVICE]

    def match(self, prompt: Sequence[int]) -> Match:
        """The longest cached block-aligned prefix of ``prompt``; of the entries that
        hold it, a device-tier one if any, else the most recently used."""
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
        entry = max((self.entries[i] for i in best), key=lambda e: (e.tier == DEVICE, e.last_used))
        entry.last_used = next(self._clock)
        entry.credit = max(entry.credit, self._floor) + n  # saved n blocks of prefill
        return Match(entry, n * self.block_size)

    def insert(self, tokens: Sequence[int], handle: Any) -> tuple[Entry | None, list[Any]]:
        """Keep ``handle`` as the device KV of ``tokens``; returns (entry, handles to free).

        Refused (its own handle comes back to be freed) when a device entry already
        covers all its blocks, or when it cannot fit even after evicting every
        unpinned device entry. Entries whose blocks it extends are dropped, their
        credit passed on to it.
        """
        hashes = block_hashes(tokens, self.block_size)
        if not hashes or len(tokens) > self.capacity[DEVICE] or self.max_entries == 0:
            return None, [handle]
        covering = self._by_hash.get(hashes[-1], set())
        if any(self._covers(self.entries[i], hashes) for i in covering):
            return None, [handle]
        superseded = self._superseded_by(hashes)
        inherited = sum(max(0.0, e.credit - self._floor) for e in superseded)
        credit = self._floor + inherited + len(hashes)
        freed = [h for e in superseded if (h := self._drop(e)) is not None]
        freed += self.evict(len(tokens), entries_needed=1)
        if self._free(DEVICE) < len(tokens) or self.counts[DEVICE] >= self.max_entries:
            return None, freed + [handle]
        entry = Entry(next(self._ids), list(tokens), hashes, handle, DEVICE, 0,
                      next(self._clock), credit)  # fmt: skip
        self._add(entry)
        return entry, freed

    def evict(self, n_tokens: int, entries_needed: int = 0) -> list[Any]:
        """Make room for ``n_tokens`` (and ``entries_needed`` entries) on the device,
        moving or dropping the least valuable entries; the device handles to free."""
        freed: list[Any] = []
        while self._free(DEVICE) < n_tokens or (
            self.counts[DEVICE] + entries_needed > self.max_entries
        ):
            handle = self.evict_one()
            if handle is None:
                break
            freed.append(handle)
        return freed

    def evict_one(self) -> Any | None:
        """Move (or drop) the least valuable unpinned device entry; its device handle,
        None when every device entry is pinned."""
        victim = self._victim(DEVICE)
        if victim is None:
            return None
        handle = victim.handle
        state = self._to_host(victim)
        if state is None:
            self._drop(victim)
        return handle

    def promote(self, entry: Entry, handle: Any) -> list[Any]:
        """``entry``'s host state was restored into device ``handle``: it lives on the
        device again. Returns device handles to free (evicted to make room)."""
        if entry.tier != HOST:
            raise RuntimeError(f"entry {entry.id} is not in the host tier")
        self._retier(entry, DEVICE, handle)
        freed = self.evict(0)  # over by this entry at most; it is pinned while restored
        return freed

    def report(self) -> p.CacheReport:
        """The heartbeat's ``cache`` field (common/blocks.py): every tier's blocks and
        sizes, and with a host tier the device's own report and the restore rate."""
        out = self.log.report()
        tiers = p.CacheTiers(**self.tiers(), kv_bytes_per_token=self.kv_bytes_per_token)
        if self.capacity[HOST]:
            device, rate = self.device_log.report(), float(round(self.restore_tok_s))
            return p.replace(out, device=device, restore_tok_s=rate, tiers=tiers)
        return p.replace(out, tiers=tiers)

    def tiers(self) -> dict[str, int]:
        """Tokens held and capacity per tier, as the heartbeat carries them."""
        return {
            "cache_tokens": self.held[DEVICE],
            "cache_capacity_tokens": self.capacity[DEVICE],
            "host_cache_tokens": self.held[HOST],
            "host_cache_capacity_tokens": self.capacity[HOST],
        }

    def request_full(self) -> None:
        self.log.request_full()
        self.device_log.request_full()

    def pin(self, entry: Entry) -> None:
        entry.pins += 1

    def unpin(self, entry: Entry) -> None:
        if entry.pins <= 0:
            raise RuntimeError(f"entry {entry.id} unpinned more often than pinned")
        entry.pins -= 1

    def clear(self) -> list[Any]:
        """Drop every unpinned entry; the device handles to free."""
        out = []
        for e in list(self.entries.values()):
            if e.pins == 0 and (h := self._drop(e)) is not None:
                out.append(h)
        return out

    # ------------------------------------------------------------ internals
    def _free(self, tier: str) -> int:
        return self.capacity[tier] - self.held[tier]

    def _victim(self, tier: str) -> Entry | None:
        unpinned = [e for e in self.entries.values() if e.tier == tier and e.pins == 0]
        if not unpinned:
            return None
        if self.policy == "lru":
            return min(unpinned, key=lambda e: e.last_used)
        victim = min(unpinned, key=lambda e: (e.credit, e.last_used))
        self._floor = max(self._floor, victim.credit)
        return victim

    def _to_host(self, entry: Entry) -> Any | None:
        """Save ``entry`` to the host tier (evicting there first); its state, or None.

        Not saved when other entries hold most of its blocks (``_worth_saving``)."""
        n = len(entry.tokens)
        if self.demote is None or n > self.capacity[HOST] or not self._worth_saving(entry):
            return None
        while self._free(HOST) < n:
            victim = self._victim(HOST)
            if victim is None:
                return None
            self._drop(victim)
        state = self.demote(entry.handle)
        if state is not None:
            self._retier(entry, HOST, state)
        return state

    def _worth_saving(self, entry: Entry) -> bool:
        """Whether a save would keep blocks no other entry holds, at least a quarter of
        the entry's. A save copies the whole sequence (over a GPU's bus: the cost a
        reused GPU worker paid per finished request, docs/results/h200/prices-hold/),
        while a later prompt can only gain the blocks nothing else holds: siblings of
        one burst share its prefix, and saving each one stores that prefix again for
        its last prompt tokens and its answer. The last entry holding a prefix owns all its blocks
        and is saved."""
        own = sum(1 for h in entry.hashes if len(self._by_hash[h]) == 1)
        return own * SAVE_OWN_SHARE >= len(entry.hashes)

    def _retier(self, entry: Entry, tier: str, handle: Any) -> None:
        n = len(entry.tokens)
        self.held[entry.tier] -= n
        self.counts[entry.tier] -= 1
        if tier == DEVICE:
            self.device_log.add(entry.hashes)
        else:
            self.device_log.remove(entry.hashes)
        entry.tier, entry.handle = tier, handle
        self.held[tier] += n
        self.counts[tier] += 1

    def _covers(self, e: Entry, hashes: list[int]) -> bool:
        return e.tier == DEVICE and len(e.hashes) >= len(hashes)

    def _superseded_by(self, hashes: list[int]) -> list[Entry]:
        """Unpinned entries (either tier) whose blocks are a prefix of ``hashes``."""
        out = []
        for i, h in enumerate(hashes):
            for eid in self._by_hash.get(h, ()):
                e = self.entries[eid]
                if len(e.hashes) == i + 1 and e.pins == 0:
                    out.append(e)
        return out

    def _add(self, entry: Entry) -> None:
        self.entries[entry.id] = entry
        for h in entry.hashes:
            self._by_hash.setdefault(h, set()).add(entry.id)
        self.log.add(entry.hashes)
        self.device_log.add(entry.hashes)
        self.held[DEVICE] += len(entry.tokens)
        self.counts[DEVICE] += 1

    def _drop(self, entry: Entry) -> Any | None:
        """Forget ``entry``; its device handle to free (None for a host state)."""
        del self.entries[entry.id]
        for h in entry.hashes:
            ids = self._by_hash[h]
            ids.discard(entry.id)
            if not ids:
                del self._by_hash[h]
        self.log.remove(entry.hashes)
        self.held[entry.tier] -= len(entry.tokens)
        self.counts[entry.tier] -= 1
        if entry.tier == DEVICE:
            self.device_log.remove(entry.hashes)
            return entry.handle
        return None
