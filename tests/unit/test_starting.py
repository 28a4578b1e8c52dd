"""Workers that have announced themselves but not registered: the router's starting
list (broker/starting.py) alone, then through the core as the worker's messages
reach it, and the announcing side's estimate of the seconds left."""

from __future__ import annotations

from tandem.broker.starting import WINDOWS, StartingList
from tandem.common import protocol as p
from tandem.workers.startup import QUICK_BUDGET_S, QUICK_DEADLINE_S, Eta
from tests.helpers import fake_ready, tiny_tokenizer
from tests.unit.test_core import core, sent


def announce(s: StartingList, wid: str, instance: str, now: float, **kw: object) -> None:
    fields = {"device": "cpu", "model": "m", "stage": "loading", "eta_s": None, "every_s": 1.0}
    s.announce(wid, instance, **{**fields, **kw}, now=now)  # type: ignore[arg-type]


def test_a_starting_worker_is_listed_with_its_stage_and_eta_counting_down():
    s = StartingList(floor_s=3.0)
    announce(s, "cpu0", "a", 10.0, stage="measuring", eta_s=4.0)
    [row] = s.rows(11.5)
    assert row["id"] == "cpu0" and row["state"] == "starting" and row["stage"] == "measuring"
    assert row["eta_s"] == 2.5 and row["starting_for_s"] == 1.5
    announce(s, "cpu0", "a", 12.0, stage="registering", eta_s=0.0)
    [row] = s.rows(20.0)
    assert row["eta_s"] == 0.0  # never below zero
    assert row["starting_for_s"] == 10.0  # since its first announcement, same instance


def test_a_silent_starting_worker_is_forgotten_after_its_window():
    s = StartingList(floor_s=3.0)
    announce(s, "cpu0", "a", 0.0, every_s=1.0)
    announce(s, "slow", "b", 0.0, every_s=2.0)
    assert s.expire(WINDOWS * 1.0 - 0.1) == []
    assert s.expire(WINDOWS * 1.0 + 0.1) == ["cpu0"]  # six announcements missed
    assert [r["id"] for r in s.rows(7.0)] == ["slow"]  # its window is 6 x 2 s
    assert s.expire(WINDOWS * 2.0 + 0.1) == ["slow"]
    short = StartingList(floor_s=30.0)  # the router's liveness floor holds for them too
    announce(short, "cpu0", "a", 0.0, every_s=1.0)
    assert short.expire(20.0) == [] and short.expire(30.5) == ["cpu0"]


def test_its_ready_replaces_it_but_another_instance_s_does_not():
    s = StartingList(floor_s=3.0)
    announce(s, "cpu0", "new", 0.0)
    s.registered("cpu0", "old")  # a predecessor's Ready (a restart's crossing): still starting
    assert [r["id"] for r in s.rows(1.0)] == ["cpu0"]
    s.registered("cpu0", "new")
    assert s.rows(1.0) == []
    announce(s, "cpu1", "x", 0.0)
    s.refused("cpu1", "x")  # a refused Ready: it stops, so it is not starting any more
    assert s.rows(1.0) == []


def test_one_entry_per_id_the_newest_and_none_shown_for_a_registered_id():
    s = StartingList(floor_s=3.0)
    announce(s, "cpu0", "a", 0.0, stage="measuring")
    announce(s, "cpu0", "b", 1.0, stage="loading")  # a second process with that id
    [row] = s.rows(2.0)
    assert row["stage"] == "loading" and row["starting_for_s"] == 1.0  # b's, since b began
    assert s.rows(2.0, registered={"cpu0"}) == []  # the registered one is what status shows
    assert [r["id"] for r in s.rows(2.0)] == ["cpu0"]  # kept: shown if that one goes


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_the_eta_follows_the_pace_and_a_quick_one_never_passes_its_deadline():
    clock = Clock()
    quick = Eta(quick=True, clock=clock)
    assert quick(0, 4) == QUICK_BUDGET_S  # nothing measured yet: the budget
    clock.t += 1.0
    assert quick(1, 4) == 3.0  # 1 s per stage, 3 stages left
    clock.t += 4.0
    assert quick(2, 4) == QUICK_DEADLINE_S - 5.0  # the pace says 5 s; the deadline 1 s
    clock.t += 9.0
    assert quick(3, 4) == 0.0
    full = Eta(quick=False, clock=clock)
    assert full(0, 8) is None  # a full measurement (a GPU compiling): no guess yet
    clock.t += 2.0
    assert full(2, 8) == 6.0


# ------------------------------------------------------------ through the router core
def starting(wid: str, instance: str, stage: str = "measuring", eta_s: float | None = 3.0):
    return p.Starting(worker_id=wid, instance=instance, device="cpu", model="m", stage=stage,
                      eta_s=eta_s, every_s=1.0)  # fmt: skip


def ready(wid: str, instance: str) -> p.Ready:
    r = fake_ready(wid, (100.0, [50.0]), 1, tiny_tokenizer())
    r.instance = instance
    return r


def test_the_core_lists_an_announced_worker_until_its_ready_and_ignores_a_late_one():
    c = core(liveness_s=3.0)
    c.worker(b"cpu0/a-announce", starting("cpu0", "a"), 0.0)
    assert sent(c) == []  # nothing owed: not a Reregister as for an unknown worker
    [row] = c.status(1.0).starting
    assert (row["id"], row["stage"], row["eta_s"]) == ("cpu0", "measuring", 2.0)
    assert c.status(1.0).workers == []
    c.worker(b"cpu0/a", ready("cpu0", "a"), 1.5)
    assert c.status(2.0).starting == [] and [w["id"] for w in c.status(2.0).workers] == ["cpu0"]
    c.worker(b"cpu0/a-announce", starting("cpu0", "a", "registering"), 1.6)  # crossed it
    assert c.status(2.0).starting == []


def test_the_core_forgets_a_silent_starting_worker_when_it_expires_workers():
    c = core(liveness_s=3.0)
    c.worker(b"x", starting("cpu0", "a"), 0.0)
    c.worker(b"y", starting("gpu0", "b"), 5.0)
    c.tick(6.5)  # cpu0 missed six announcements; gpu0 spoke 1.5 s ago
    assert [r["id"] for r in c.status(6.5).starting] == ["gpu0"]


def test_a_duplicate_id_s_announcement_is_not_shown_and_its_refused_ready_drops_it():
    c = core(liveness_s=3.0)
    c.worker(b"cpu0/a", ready("cpu0", "a"), 0.0)
    c.worker(b"cpu0/b-announce", starting("cpu0", "b"), 0.5)
    assert c.status(0.5).starting == []  # cpu0 is registered: its row is what status shows
    c.worker(b"cpu0/b", ready("cpu0", "b"), 1.0)  # a's holder is live: b waits or is refused
    cache = p.CacheReport(full=True, seq=1)
    hb = p.Heartbeat(worker_id="cpu0", seq=1, active=[], queued=[], kv_used_tokens=0,
                     kv_capacity_tokens=8192, cache=cache)  # fmt: skip
    c.worker(b"cpu0/a", hb, 1.2)  # the holder speaks after b's claim began: b is a duplicate
    c.worker(b"cpu0/b", ready("cpu0", "b"), 1.5)
    refused = [m for peer, m in sent(c) if peer == b"cpu0/b" and isinstance(m, p.Error)]
    assert refused and "cpu0" in refused[0].message
    assert c.starting.workers == {}  # it stops: not starting any more
