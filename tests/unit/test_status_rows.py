"""Status rows reused between queries are the rows ``describe`` makes afresh."""

from __future__ import annotations

import random
from typing import Any

from studies.router_state import loaded_router
from tandem.broker.core import RouterCore
from tandem.broker.statusrows import StatusRows
from tandem.common import protocol as p

SAME = p.CacheReport(full=False, base=1, seq=1)  # a heartbeat's "no cache changes"


def _fresh(core: RouterCore, now: float) -> list[dict[str, Any]]:
    ordered = sorted(core.workers.values(), key=lambda w: w.id)
    return [w.describe(core.cfg.calibrate, now) for w in ordered]


def test_kept_rows_match_fresh_ones_as_workers_change() -> None:
    core = loaded_router(12, random.Random(3))
    now = 1e6
    assert core.status(now).workers == _fresh(core, now)
    ws = sorted(core.workers.values(), key=lambda w: w.id)
    # A heartbeat, a finish, an assign and a removal, each between two queries.
    w0 = ws[0]
    core.worker(w0.identity, p.Heartbeat(w0.id, 2, [], [], 0, 8192, SAME), now)
    assert core.status(now + 1).workers == _fresh(core, now + 1)
    w1 = ws[1]
    req = core.requests[next(iter(w1.inflight))]
    core._forget(w1, req)
    w1.routed_total += 5
    assert core.status(now + 2).workers == _fresh(core, now + 2)
    del core.workers[ws[2].id]
    rows = core.status(now + 3).workers
    assert rows == _fresh(core, now + 3) and len(rows) == 11


def test_kept_rows_are_bounded_by_the_workers_asked_about() -> None:
    core = loaded_router(8, random.Random(4))
    rows = StatusRows()
    ws = list(core.workers.values())
    for k in range(8, 0, -1):
        rows.rows(ws[:k], True, 1e6)
        assert len(rows._kept) == k


def test_a_heartbeat_saying_the_same_keeps_the_row_one_saying_more_remakes_it() -> None:
    core = loaded_router(2, random.Random(5))
    now = 1e6
    w = sorted(core.workers.values(), key=lambda w: w.id)[0]
    core.worker(w.identity, p.Heartbeat(w.id, 2, [], [], 0, 8192, SAME), now)
    first = core.status(now).workers[0]
    core.worker(w.identity, p.Heartbeat(w.id, 3, [], [], 0, 8192, SAME), now)
    again = core.status(now).workers[0]
    assert again == first == _fresh(core, now)[0]
    core.worker(w.identity, p.Heartbeat(w.id, 4, [], [], 100, 8192, SAME), now)
    assert core.status(now).workers[0]["kv_used_tokens"] == 100
