"""What `tandem generate` says while the router holds its request, from the status."""

from __future__ import annotations

from tandem.cli.use import waiting_line
from tandem.common import protocol as p


def _worker(wid: str, active: int, max_active: int = 4) -> dict:
    return {"id": wid, "device": f"dev-{wid}", "active": active, "max_active": max_active}


def test_no_worker_yet():
    line = waiting_line(p.StatusReply("finish_time", [], requests_pending=1))
    assert line.startswith("waiting for a worker to register: none has yet")


def test_a_pinned_worker_not_registered_is_named():
    reply = p.StatusReply("finish_time", [_worker("cpu0", 0)], requests_pending=1)
    assert "waiting for worker gpu0 to register" in waiting_line(reply, "gpu0")
    assert "gpu0" not in waiting_line(reply, "dev-cpu0")  # its device label selects it


def test_every_worker_full():
    reply = p.StatusReply("finish_time", [_worker("a", 4), _worker("b", 2, 2)], requests_pending=3)
    line = waiting_line(reply)
    assert "every worker is full (a 4/4, b 2/2)" in line and "3 request(s)" in line
    reply.workers[0]["active"] = 1
    assert waiting_line(reply).startswith("waiting at the router")


def _starting(wid: str, stage: str, eta_s: float | None, for_s: float = 1.0) -> dict:
    return {"id": wid, "state": "starting", "device": "cpu", "model": "m", "stage": stage,
            "eta_s": eta_s, "starting_for_s": for_s, "last_seen_s": 0.1}  # fmt: skip


def test_a_starting_worker_is_named_with_its_stage_and_time_left():
    reply = p.StatusReply(policy="lookahead", workers=[], requests_pending=1,
                          starting=[_starting("cpu0", "measuring", 4.2)])  # fmt: skip
    assert waiting_line(reply) == "waiting for worker cpu0 (measuring itself, ~4 s)"
    reply.starting = [
        _starting("cpu0", "loading", None, 12.3),
        _starting("gpu0", "registering", 0.0),
    ]
    assert waiting_line(reply) == (
        "waiting for workers cpu0 (loading its model, 12 s so far), gpu0 (ready soon, any moment)"
    )
    assert waiting_line(reply, "gpu0") == "waiting for worker gpu0 (ready soon, any moment)"


def test_nothing_is_said_once_the_request_left_the_router():
    reply = p.StatusReply(policy="lookahead", workers=[_worker("cpu0", 1)], requests_pending=0)
    assert waiting_line(reply) == ""
