"""Prefix blocks: how a worker tells the router exactly which prompt prefixes it holds.

A token sequence is cut into blocks of ``block_size`` tokens; block i's hash
chains the hash of block i-1 with block i's tokens, so one hash names a whole
prefix. A worker advertises the set of block hashes it holds; the router hashes
an incoming prompt the same way and walks the chain: the number of leading
hashes present times the block size is exactly what that worker's cache will
match (workers match at block granularity for this reason).

The set travels as deltas with sequence numbers plus a full listing on request
and on a slow period (``CacheLog`` on the worker, ``CacheView`` on the router):
heartbeats stay small, and a lost or reordered delta is detected, not guessed.

Tiers: a worker with a host-RAM tier (workers/host_cache.py) adds to its report a
``device`` report of its own (the blocks held on the device, a second CacheLog) and
``restore_tok_s`` (how fast it restores from host RAM; 0: not measured yet). The
router then knows which held blocks a hit would restore rather than share, and
prices them so (common/pricing.py ``tier_cached``). Without the key every held
block is on the device.
"""

from __future__ import annotations

import hashlib
import math
from array import array
from collections.abc import Iterable, Iterator, Sequence
from itertools import takewhile
from typing import overload

import msgspec

from tandem.common.protocol import CacheReport

_ROOT = b"tandem-prefix-v1"


def block_hashes(tokens: Sequence[int], block_size: int) -> list[int]:
    """Chained hashes of every *full* block of ``tokens`` (the tail is ignored)."""
    hashes: list[int] = []
    n = len(tokens) // block_size * block_size
    if n > 0:
        _chain(_ROOT, _token_bytes(tokens[:n]), block_size, hashes)
    return hashes


def _token_bytes(tokens: Sequence[int]) -> bytes:
    return array("i", tokens).tobytes()


def _chain(parent: bytes, data: bytes, block_size: int, out: list[int]) -> bytes:
    """Append to ``out`` the hashes of ``data``'s blocks (``_token_bytes`` of whole
    blocks), chained from ``parent`` (a digest, or _ROOT); returns the last digest.
    The tokens are converted once, not once per block: 30 % of the time."""
    step = array("i").itemsize * block_size
    blake, from_bytes = hashlib.blake2b, int.from_bytes
    for start in range(0, len(data), step):
        parent = blake(parent + data[start : start + step], digest_size=8).digest()
        out.append(from_bytes(parent, "little") >> 1)  # fits msgpack int64
    return parent


# The router hashes each routed prompt's leading blocks, and prompts share prefixes:
# a block's digest by its input (parent digest + block bytes), up to _SEEN_MAX blocks
# (~150 bytes each; cleared when full). A lookup costs a fifth of a hash.
_SEEN: dict[bytes, tuple[bytes, int]] = {}
_SEEN_MAX = 1 << 14


def _chain_seen(parent: bytes, data: bytes, block_size: int, out: list[int]) -> bytes:
    """``_chain``, with the digests of blocks already seen looked up in ``_SEEN``."""
    step = array("i").itemsize * block_size
    seen = _SEEN
    for start in range(0, len(data), step):
        key = parent + data[start : start + step]
        got = seen.get(key)
        if got is None:
            if len(seen) >= _SEEN_MAX:
                seen.clear()
            digest = hashlib.blake2b(key, digest_size=8).digest()
            got = seen[key] = (digest, int.from_bytes(digest, "little") >> 1)
        parent = got[0]
        out.append(got[1])
    return parent


class PrefixChain(Sequence[int]):
    """The block hashes of a prompt's first ``blocks`` blocks (``block_hashes``), hashed
    only as far as they are read: most workers hold none of a new prompt's first block,
    so a decision usually hashes one block, not the whole prompt."""

    def __init__(self, tokens: Sequence[int], block_size: int, blocks: int) -> None:
        self._tokens = tokens
        self.block_size = block_size
        self._blocks = max(0, blocks)
        self._hashes: list[int] = []
        self._parent = _ROOT
        self._last = -1  # the blocks matched at the last ``matched_tokens`` (-1: none yet)

    def first(self, k: int) -> list[int]:
        """The first ``k`` hashes (all of them, if fewer), hashing what is missing."""
        k = min(k, self._blocks)
        have = len(self._hashes)
        if have < k:
            bs = self.block_size
            data = _token_bytes(self._tokens[have * bs : k * bs])
            self._parent = _chain_seen(self._parent, data, bs, self._hashes)
        return self._hashes

    def matched_tokens(self, held: set[int] | frozenset[int]) -> int:
        """``matched_tokens`` of this prefix, hashing one block past the match at most
        (in doubling runs). The answer given last is tried first: workers that served
        one prefix hold the same blocks of it, and confirming that ``held`` has the
        first m blocks and not the next is one C call (``issuperset``), not a walk."""
        m, hashes = self._last, self._hashes
        confirmed = m >= 0 and (m == self._blocks or hashes[m] not in held)
        if confirmed and held.issuperset(hashes[:m]):
            return m * self.block_size
        held_by = held.__contains__
        k = 1
        while True:
            hashes = self._hashes  # all hashed so far: k or more
            if len(hashes) < k:
                hashes = self.first(k)
            n = len(list(takewhile(held_by, hashes)))  # the walk in C: 3x a Python loop
            if n < len(hashes) or len(hashes) == self._blocks:
                self._last = n  # hashes[n] exists unless n is every block
                return n * self.block_size
            k = 2 * len(hashes)

    def __len__(self) -> int:
        return self._blocks

    def __iter__(self) -> Iterator[int]:
        return iter(self.first(self._blocks))

    @overload
    def __getitem__(self, i: int) -> int: ...
    @overload
    def __getitem__(self, i: slice) -> list[int]: ...
    def __getitem__(self, i: int | slice) -> int | list[int]:
        return self.first(self._blocks)[i]


def matched_tokens(hashes: Sequence[int], held: set[int] | frozenset[int], block_size: int) -> int:
    """Tokens of a prompt (given its block hashes) covered by the ``held`` set."""
    n = 0
    for h in hashes:
        if h not in held:
            break
        n += 1
    return n * block_size


class CacheLog:
    """Worker side: a refcounted multiset of held block hashes and its change log."""

    def __init__(self) -> None:
        self.refs: dict[int, int] = {}
        self.seq = 0
        self._added: set[int] = set()
        self._removed: set[int] = set()
        self._full_requested = True  # the first report is always a full listing

    def add(self, hashes: Iterable[int]) -> None:
        for h in hashes:
            n = self.refs.get(h, 0)
            self.refs[h] = n + 1
            if n == 0 and h in self._removed:
                self._removed.discard(h)  # removed and re-added since the last report
            elif n == 0:
                self._added.add(h)

    def remove(self, hashes: Iterable[int]) -> None:
        for h in hashes:
            n = self.refs[h]
            if n > 1:
                self.refs[h] = n - 1
                continue
            del self.refs[h]
            if h in self._added:
                self._added.discard(h)  # added and removed since the last report
            else:
                self._removed.add(h)

    def request_full(self) -> None:
        self._full_requested = True

    def report(self) -> CacheReport:
        """The ``cache`` field of the next heartbeat (consumes pending changes)."""
        base = self.seq
        if self._full_requested:
            self.seq += 1
            self._full_requested = False
            self._added.clear()
            self._removed.clear()
            return CacheReport(full=True, seq=self.seq, blocks=list(self.refs))
        if not self._added and not self._removed:
            return CacheReport(full=False, base=base, seq=base)
        self.seq += 1
        out = CacheReport(
            full=False,
            base=base,
            seq=self.seq,
            added=list(self._added),
            removed=list(self._removed),
        )
        self._added.clear()
        self._removed.clear()
        return out


class CacheView:
    """Router side: the block set of one worker, rebuilt from heartbeat reports.

    ``held`` is what the reports say plus what the router saw finish there and has
    not been told of yet (``note``): a worker keeps a finished request's blocks in
    its prefix cache before its next heartbeat can say so, and routing the next
    request of a burst with the same prefix must not wait for that heartbeat. A
    noted block counts until ``until``; after that only the reports do.

    It also holds the prompt blocks of the requests routed there and not finished
    (``hold`` .. ``release``): the worker is computing them, and a request that
    shares them joins that computation (workers/engine.py), so a burst sharing a
    prefix is priced with it cached where the first went. Counted per request, so
    it holds no more than the requests in flight there (``Admission.inflight_cap``).
    """

    def __init__(self) -> None:
        # reported | noted: what routing matches against. Always this one set object.
        self.held: set[int] = set()
        self.seq = -1  # nothing applied yet
        self._reported: set[int] = set()
        self._noted: dict[int, float] = {}  # block -> until (clock time)
        self._assigned: dict[int, int] = {}  # block -> requests in flight here with it
        self.device: CacheView | None = None  # the device tier's, when the worker has a host tier
        self.restore_tok_s = 0.0  # the worker's host-RAM restore rate (0: unknown)
        self.tiers: dict[str, int] = {}  # the last report's CacheTiers, as a status row shows them

    def note(self, blocks: Sequence[int], until: float) -> None:
        """``blocks`` finished on this worker: count them as cached until ``until``."""
        for h in blocks:
            if h not in self._reported:
                self._noted[h] = until
                self.held.add(h)
        if self.device is not None:  # a finished request's KV is kept on the device
            self.device.note(blocks, until)

    def hold(self, blocks: Sequence[int]) -> None:
        """A request with these prompt blocks was routed here: held until ``release``."""
        assigned = self._assigned
        for h in blocks:
            assigned[h] = assigned.get(h, 0) + 1
        self.held.update(blocks)
        if self.device is not None:  # its KV is being computed on the device
            self.device.hold(blocks)

    def release(self, blocks: Sequence[int]) -> None:
        """That request ended (call ``note`` first when it finished): its blocks count
        only as long as something else holds them."""
        assigned, held = self._assigned, self.held
        for h in blocks:
            n = assigned.pop(h, 0) - 1
            if n > 0:
                assigned[h] = n
            elif h not in self._reported and h not in self._noted:
                held.discard(h)
        if self.device is not None:
            self.device.release(blocks)

    def expire(self, now: float) -> None:
        """Noted blocks past their time count only if a report has them."""
        if self.device is not None:
            self.device.expire(now)
        if not self._noted:
            return
        gone = [h for h, until in self._noted.items() if until <= now]
        for h in gone:
            del self._noted[h]
            if h not in self._reported and h not in self._assigned:
                self.held.discard(h)

    def apply(self, report: CacheReport, now: float = math.inf) -> bool:
        """Apply one report (received at ``now``, typed and bounded by the decoder);
        False means a delta was missed and a full resync is needed."""
        if report.full:
            self._reported = set(report.blocks)
            # The same set, refilled: the router keeps a reference (broker/ledger.py).
            self.held.clear()
            self.held.update(self._reported, self._noted, self._assigned)
            self.seq = report.seq
        else:
            if report.base != self.seq:
                return report.seq == self.seq  # an empty delta at our seq is fine; else a gap
            removed = report.removed
            self._reported.difference_update(removed)
            kept = self._noted, self._assigned
            self.held.difference_update(h for h in removed if not any(h in k for k in kept))
            self._reported.update(report.added)
            self.held.update(report.added)
            self.seq = report.seq
        self.expire(now)
        return self._apply_device(report, now)

    def size_after(self, report: CacheReport) -> int:
        """Blocks the worker's reports would list once ``report`` is applied (what is
        listed now when it is a delta that does not apply): checked against its
        declared capacity before ``apply`` (broker/peerbounds.py)."""
        if report.full:
            return len(set(report.blocks))
        if report.base != self.seq:
            return len(self._reported)
        reported = self._reported
        gone = reported.intersection(report.removed)
        fresh = sum(1 for h in set(report.added) if h not in reported or h in gone)
        return len(reported) - len(gone) + fresh

    def host_blocks(self) -> int:
        """Blocks held only in the worker's host-RAM tier (0 without one)."""
        return len(self.held - self.device.held) if self.device is not None else 0

    def _apply_device(self, report: CacheReport, now: float) -> bool:
        """The ``tiers``; the ``device`` sub-report and ``restore_tok_s`` of a tiered worker."""
        if report.tiers is not None:
            self.tiers = msgspec.structs.asdict(report.tiers)
        sub = report.device
        if sub is None:
            return True
        if self.device is None:
            self.device = CacheView()
        self.restore_tok_s = report.restore_tok_s
        return self.device.apply(sub, now)
