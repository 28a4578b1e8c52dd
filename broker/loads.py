"""One worker's in-flight requests as the policies see them, kept current event by event.

Building a worker's view used to walk its whole ledger (every in-flight request,
against the last heartbeat's rows) once per decision: with 256 requests on one
worker that was most of the router's time. ``Loads`` keeps each request's
``Load`` and the worker's running totals instead, and touches only what an event
changes: one entry on assign or finish; every entry on a heartbeat (which
re-reports them all). Relayed tokens only mark their entry stale (``touch``, a
set insertion per token frame); stale entries are recomputed when a view is
next built (``settle``), once however many frames arrived in between. The
result equals a walk of the ledger (``WorkerState.view`` still does one;
tests/unit/test_hotpath.py compares them).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from tandem.broker.policies import Load
from tandem.common import protocol as p


class Ledgered(Protocol):
    """What ``Loads`` needs of one ledger entry (``registry.Routed``)."""

    tokens_seen: int  # relayed tokens: > 0 proves the request active

    def load(self, reported: p.RequestRow | None, queued: bool = False) -> Load: ...


class Loads:
    """Active and queued Loads by worker-side id (ledger order) and their totals."""

    def __init__(self) -> None:
        self.active: dict[str, Load] = {}
        self.queued: dict[str, Load] = {}
        self.prefill_total = 0  # sum of prefill_remaining over both
        self.decode_total = 0  # sum of decode_remaining over both
        self._stale: set[str] = set()  # entries whose request relayed tokens since
        self._reported: dict[str, p.RequestRow] = {}  # the last heartbeat's rows
        self._listed_active: frozenset[str] = frozenset()

    def set(self, wid: str, routed: Ledgered) -> None:
        """(Re)compute one entry: it was assigned or had tokens relayed."""
        active = self.is_active(wid, routed)
        load = routed.load(self._reported.get(wid), queued=not active)
        # Only a rebuild moves an entry between active and queued (a heartbeat, or the
        # first relayed tokens: see ``moves``), so an update is in place: the entry
        # keeps its position, as in the ledger's order.
        loads = self.active if active else self.queued
        old = loads.get(wid)
        if old is not None:
            self.prefill_total -= old.prefill_remaining
            self.decode_total -= old.decode_remaining
        loads[wid] = load
        self.prefill_total += load.prefill_remaining
        self.decode_total += load.decode_remaining

    def is_active(self, wid: str, routed: Ledgered) -> bool:
        """Listed active by the last heartbeat, or proven so by relayed tokens (a
        heartbeat older than them may still list it as queued)."""
        return wid in self._listed_active or routed.tokens_seen > 0

    def moves(self, wid: str, routed: Ledgered) -> bool:
        """True when updating ``wid`` would move it from queued to active."""
        return wid in self.queued and self.is_active(wid, routed)

    def touch(self, wid: str) -> None:
        """``wid`` relayed tokens: recompute it before the next view (``settle``)."""
        self._stale.add(wid)

    def settle(self, inflight: Mapping[str, Ledgered]) -> None:
        """Recompute the entries touched since the last view; all of them, in ledger
        order, when one became active by its first relayed tokens."""
        stale, self._stale = self._stale, set()
        if any(wid in inflight and self.moves(wid, inflight[wid]) for wid in stale):
            self._recompute(inflight)
            return
        for wid in stale:
            routed = inflight.get(wid)
            if routed is not None:
                self.set(wid, routed)

    def drop(self, wid: str) -> None:
        """Forget one entry (finished, cancelled or lost)."""
        self._stale.discard(wid)
        load = self.active.pop(wid, None) or self.queued.pop(wid, None)
        if load is not None:
            self.prefill_total -= load.prefill_remaining
            self.decode_total -= load.decode_remaining

    def rebuild(self, inflight: Mapping[str, Ledgered], hb: p.Heartbeat | None) -> None:
        """Every entry again, from a new heartbeat (in ledger order)."""
        self._reported = {r.id: r for r in hb.active + hb.queued} if hb is not None else {}
        self._listed_active = frozenset(r.id for r in hb.active) if hb is not None else frozenset()
        self._stale.clear()
        self._recompute(inflight)

    def _recompute(self, inflight: Mapping[str, Ledgered]) -> None:
        self.active, self.queued = {}, {}
        self.prefill_total = self.decode_total = 0
        for wid, routed in inflight.items():
            self.set(wid, routed)
