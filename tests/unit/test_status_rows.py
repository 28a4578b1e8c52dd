"""``tandem status``'s rows are kept between calls (broker/ledger.py StatusRows): each
call's rows equal rows described afresh, through assigns, heartbeats, finishes, the
clock moving and workers leaving, and no row outlives its worker."""

from __future__ import annotations

import random

from tandem.bench.router_state import PREFIXES, _discard, _route, loaded_router
from tandem.broker.core import RouterCore
from tandem.common import protocol as p


def _fresh(core: RouterCore, now: float) -> list[dict]:
    live = core.cfg.calibrate
    return [w.describe(live, now) for w in sorted(core.workers.values(), key=lambda w: w.id)]


def _check(core: RouterCore, now: float) -> None:
    assert core.status(now).workers == _fresh(core, now)


def test_kept_rows_match_fresh_ones_through_every_event() -> None:
    core = loaded_router(6, random.Random(3))
    now = max(w.last_seen for w in core.workers.values())
    _check(core, now)
    _check(core, now + 2.5)  # only the ages moved
    req = _route(core, "s1", PREFIXES[0][:100])  # an assign: one worker's ledger grew
    _discard(core)
    _check(core, now + 2.6)
    w = core.workers[req.worker_id or ""]
    rows = [p.RequestRow(wid, 100, 0, 10, 1) for wid in w.inflight]
    beat = p.Heartbeat(w.id, 9, rows, [], 0, 8192, p.CacheReport(full=True, seq=2))
    core.worker(w.identity, beat, now + 3)
    _check(core, now + 3.1)
    core.worker(w.identity, p.Goodbye(w.id), now + 3.2)  # gone: its row with it
    _discard(core)
    _check(core, now + 3.3)
    assert w.id not in core.status_rows._rows
    assert len(core.status_rows._rows) == len(core.workers) == 5
