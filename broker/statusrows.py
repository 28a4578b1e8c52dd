"""``status`` rows kept between queries: a fleet's reply built from what changed.

A worker's status row (``WorkerState.describe``) rounds its rate tables and copies
its heartbeat's request rows: ~20 us a worker, so 20 ms of the loop per ``status``
at 1,024 workers. Most of a row follows from three objects the worker replaces,
never changes in place: its registration (``info``), its prices (``rates``, a new
object when its step model or repricing moves) and what its last heartbeat lists
(an idle worker's heartbeats list the same, compared by value). A row is kept with
what it was made from and reused while that is unchanged; the few fields that move
without them (the ledger's counts, the cache's sizes, what it served, the time
since it was last seen) are written afresh on every query. The reply is the one
``describe`` would give (tests/unit/test_status_rows.py).
"""

from __future__ import annotations

from operator import is_
from typing import Any

from tandem.broker.registry import WorkerState
from tandem.common import protocol as p

_Kept = tuple[tuple[object, ...], tuple[object, ...], dict[str, Any]]


class StatusRows:
    """Rows by worker, at most one per registered worker (``rows`` drops the rest)."""

    def __init__(self) -> None:
        # id -> ((the worker, live, its info, its prices), what its heartbeat showed, row)
        self._kept: dict[str, _Kept] = {}

    def rows(self, workers: list[WorkerState], live: bool, now: float) -> list[dict[str, Any]]:
        """``[w.describe(live, now) for w in workers]``, reusing unchanged rows."""
        kept: dict[str, _Kept] = self._kept
        fresh: dict[str, _Kept] = {}
        out = []
        for w in workers:
            made: tuple[object, ...] = (w, live, w.info, w.rates(live))
            shown = _shown(w.heartbeat)
            got = kept.get(w.id)
            if got is not None and all(map(is_, got[0], made)) and got[1] == shown:
                row = got[2]  # written in place: a reply is encoded as it is made
                _moving(row, w, now)
            else:
                row = w.describe(live, now)
            fresh[w.id] = (made, shown, row)
            out.append(row)
        self._kept = fresh  # only the workers still registered
        return out


def _shown(hb: p.Heartbeat | None) -> tuple[object, ...]:
    """What a row shows of a heartbeat: a worker heartbeats every 0.5 s, each one a new
    object, but an idle worker's says the same each time (compared by value)."""
    if hb is None:
        return ()
    return (hb.active, hb.queued, hb.kv_used_tokens, hb.kv_capacity_tokens)


def _moving(row: dict[str, Any], w: WorkerState, now: float) -> None:
    """Write the row's fields that move without a new registration, heartbeat or prices."""
    row["inflight"] = len(w.inflight)
    row["routed_total"] = w.routed_total
    row["cached_blocks"] = len(w.cache.held)
    row["host_blocks"] = w.cache.host_blocks()
    if w.cache.tiers:
        row.update(w.cache.tiers)
    row["provisional"] = w.provisional
    row["live_steps"] = w.live_steps
    row["served"] = w.served.describe()
    row["last_seen_s"] = round(now - w.last_seen, 3)
