"""The flush sequence exists once (broker/core.py ``RouterCore.flush``) and every
driver of the router core sends through it: the live loop, the core driven
directly, the twin's loop and the router bench. The one flush is swapped here for
one that notes every message it hands over; a driver that restated the steps (took
``out`` itself, released Accepteds, settled) would deliver messages the note lacks.
Likewise the live loop and the twin read a worker's frames through one function
(``RouterCore.worker_frame``).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from studies import router_state
from tandem.broker.core import RouterCore
from tandem.broker.outgoing import Held, Lost, Peers, Records
from tandem.common import protocol as p
from tests.replay_links import LINKS

RATES = (900.0, [120.0, 200.0])


class Noting:
    """The driver's peers, behind a note of what the one flush handed them."""

    def __init__(self, peers: Peers, noted: list[tuple[str, bytes, p.Message]]) -> None:
        self.peers, self.noted = peers, noted

    def to_workers(self, held: Held, now: float) -> Lost:
        self.noted += [("worker", peer, m) for peer, msgs in held.items() for m in msgs]
        return self.peers.to_workers(held, now)

    def to_clients(self, held: Held, now: float) -> Lost:
        self.noted += [("client", peer, m) for peer, msgs in held.items() for m in msgs]
        return self.peers.to_clients(held, now)

    def write_decisions(self, records: Records, now: float) -> None:
        self.peers.write_decisions(records, now)


@pytest.fixture
def noted(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, bytes, p.Message]]:
    seen: list[tuple[str, bytes, p.Message]] = []
    flush = RouterCore.flush

    def noting_flush(core: RouterCore, peers: Peers, now: float) -> None:
        flush(core, Noting(peers, seen), now)

    monkeypatch.setattr(RouterCore, "flush", noting_flush)
    return seen


@pytest.mark.parametrize("driver", sorted(LINKS))
def test_every_assign_a_driver_delivers_left_through_the_one_flush(
    driver: str, noted: list[tuple[str, bytes, p.Message]], tmp_path: Path
) -> None:
    link = LINKS[driver](tmp_path, {"policy": "least_loaded", "calibrate": True})
    try:
        for wid in ("a", "b"):
            link.start_worker(wid, RATES, max_active=2)
        for i in range(3):
            link.submit(p.Submit(f"r{i}", tokens=[1, 2, 3, i + 4], sampling=p.SamplingParams(4)))
        delivered = link.assigned()
        wid, assign = delivered[0]
        link.from_worker(wid, p.TokenDelta(assign.request_id, [7], "x"))
        link.from_worker(wid, p.Done(assign.request_id, p.FinishReason.LENGTH))
        link.submit(p.Submit("r9", tokens=[9, 9], sampling=p.SamplingParams(4)))
        delivered += link.assigned()
    finally:
        link.close()
    through_flush = [(peer.split(b"/")[0].decode(), m.request_id) for side, peer, m in noted
                     if side == "worker" and isinstance(m, p.Assign)]  # fmt: skip
    assert len(delivered) == 4
    assert sorted((w, a.request_id) for w, a in delivered) == sorted(through_flush)
    # The client's side passed there too: its Accepteds, the token and the Done.
    to_client = [type(m) for side, _, m in noted if side == "client"]
    assert to_client.count(p.Accepted) == 4 and p.TokenDelta in to_client and p.Done in to_client


def test_the_router_bench_discards_through_the_one_flush(
    noted: list[tuple[str, bytes, p.Message]],
) -> None:
    core = router_state.loaded_router(3, random.Random(1), inflight_each=1)
    warmed = [m.request_id for side, _, m in noted if isinstance(m, p.Assign)]
    assert len(warmed) == 3
    noted.clear()
    router_state.time_decision(core, 0)
    assert [type(m) for _, _, m in noted] == [p.Assign, p.Accepted]
    assert not (core.out.workers or core.out.clients or core.settling or core.accepts)


@pytest.mark.parametrize("driver", ["live", "twin"])
def test_the_live_loop_and_the_twin_read_a_workers_frames_through_one_function(
    driver: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    read: list[p.Message] = []
    worker_frame = RouterCore.worker_frame

    def noting(core: RouterCore, identity: bytes, frame: bytes, now: float) -> None:
        read.append(p.decode(frame))
        worker_frame(core, identity, frame, now)

    monkeypatch.setattr(RouterCore, "worker_frame", noting)
    link = LINKS[driver](tmp_path, {"policy": "least_loaded", "calibrate": True})
    try:
        link.start_worker("a", RATES, max_active=2)
        link.submit(p.Submit("r1", tokens=[1, 2, 3], sampling=p.SamplingParams(4)))
        ((_, assign),) = link.assigned()
        rid = assign.request_id
        sent = [p.TokenDelta(rid, [7], "x"), p.Done(rid, p.FinishReason.LENGTH)]
        for msg in sent:
            link.from_worker("a", msg)
        assert not link.assigned()
    finally:
        link.close()
    assert [m for m in read if not isinstance(m, p.Ready)] == sent
