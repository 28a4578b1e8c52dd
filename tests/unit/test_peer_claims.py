"""What a worker claims is held to physics and to what it serves, at the socket.

Fake workers are DealerSockets on the live router's loop (tests/helpers.py Harness):
every frame below is one an outside peer could send.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from tandem.broker.policies import WorkerView
from tandem.broker.policies.finish import predict_finish_s
from tandem.broker.policies.views import RouteRequest
from tandem.cli.main import main
from tandem.cli.tables import workers_table
from tandem.common import protocol as p
from tandem.common.pricing import price
from tandem.common.steptime import StepModel
from tandem.common.validation import MAX_RATE_TOK_S, MIN_STEP_S
from tests.helpers import Harness, fake_ready
from tests.liar import HONEST, PREFILL_TOK_S, REAL_ROW_TOK_S, FakeWorker, Traffic


def _status(h: Harness) -> p.StatusReply:
    h.client.send(p.StatusQuery())
    h.pump()
    reply = h.recv(h.client)  # a reply the client could not decode fails here
    assert isinstance(reply, p.StatusReply), reply
    return reply


def test_a_heartbeat_step_of_5e_324_s_is_refused_and_routing_stays_finite(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    try:
        h.add_worker("liar", (1000.0, [50.0, 90.0]), max_active=2)
        h.add_worker("other", (1000.0, [50.0, 90.0]), max_active=2)
        steps = p.StepReport(decode_batch=[1], decode_step_s=[5e-324], decode_samples=[64])
        h.heartbeat("liar", 1, steps=steps)
        refused = h.recv(h.workers["liar"])
        assert isinstance(refused, p.Error) and "steps.s[0]" in refused.message
        assert h.core.workers["liar"].steps is None  # nothing of it reached pricing
        rows = _status(h).workers
        assert all(math.isfinite(x) for w in rows for x in w["priced_decode_tok_s"])
        for i in range(4):  # routing prices both without a ZeroDivisionError
            h.submit(f"r{i}", [5, 6, 7, 8, 9] * 8, max_tokens=8)
    finally:
        h.close()


def test_a_step_under_a_microsecond_and_a_rate_past_any_device_are_refused(
    tmp_path: Path,
) -> None:
    h = Harness(tmp_path)
    try:
        h.add_worker("w", (1000.0, [50.0]), max_active=1)
        fast = p.StepReport(decode_batch=[1], decode_step_s=[MIN_STEP_S / 2], decode_samples=[9])
        h.heartbeat("w", 1, steps=fast)
        assert isinstance(h.recv(h.workers["w"]), p.Error)
        sock = h.workers["w"]
        sock.send(fake_ready("greedy", (1000.0, [MAX_RATE_TOK_S * 10]), 1, h.spec))
        h.pump()
        refused = h.recv(sock)
        assert isinstance(refused, p.Error) and "decode_tok_s" in refused.message
        assert "greedy" not in h.core.workers
    finally:
        h.close()


def test_a_heartbeat_row_claiming_more_work_than_its_request_is_held_to_it(
    tmp_path: Path,
) -> None:
    h = Harness(tmp_path)
    try:
        h.add_worker("w", (1000.0, [50.0]), max_active=1)
        h.submit("r", [5] * 40, max_tokens=8)
        wid = h.assigned("w").request_id
        huge = 1 << 40  # within the wire's counters, past anything the request holds
        h.heartbeat("w", 1, queued=[p.RequestRow(wid, huge, 0, huge, huge)])
        (load,) = h.view("w", [1, 2, 3]).queued
        assert load.prefill_remaining <= 40 and load.decode_remaining <= 8
    finally:
        h.close()


def test_nothing_derived_from_bounded_reports_is_inf_or_nan() -> None:
    fastest = StepModel((1, 4096), (MIN_STEP_S, MIN_STEP_S), (64, 64))
    rates = price(MAX_RATE_TOK_S, [MAX_RATE_TOK_S] * 4096, 4096, fastest)
    assert all(math.isfinite(x) and 0 < x <= MAX_RATE_TOK_S for x in rates.decode_tok_s)
    # A view priced at infinity (a report no bound stopped) must not divide by zero.
    view = WorkerView("w", math.inf, (math.inf,), max_active=1)
    assert predict_finish_s(RouteRequest(100, 10), view) >= 0


def _explain_says_repriced(tmp_path: Path, rows: list[dict]) -> None:
    """`tandem route explain` on a state built from status rows names the repricing."""
    workers = [
        {"id": w["id"], "prefill_rate": w["priced_prefill_tok_s"],
         "decode_rate": w["priced_decode_tok_s"], "served": w["served"]}
        for w in rows
    ]  # fmt: skip
    path = tmp_path / "state.json"
    path.write_text(json.dumps({"request": {"prompt_tokens": 40, "max_tokens": 20},
                                "workers": workers}))  # fmt: skip
    result = CliRunner().invoke(main, ["route", "explain", str(path), "--json"])
    assert result.exit_code == 0, result.output
    assert set(json.loads(result.stdout)["repriced"]) == {"liar"}
    result = CliRunner().invoke(main, ["route", "explain", str(path)])
    assert "repriced liar: its served tokens show" in result.stderr


# ------------------------------------------------------------ a worker that lies
def test_a_worker_claiming_100x_its_speed_is_repriced_and_does_not_take_all_traffic(
    tmp_path: Path,
) -> None:
    h = Harness(tmp_path, policy="finish_time")
    try:
        h.add_worker("honest", (PREFILL_TOK_S, HONEST), max_active=4)
        h.add_worker("liar", (PREFILL_TOK_S * 100, [x * 100 for x in HONEST]), max_active=4)
        fakes = [FakeWorker(wid, h.workers[wid]) for wid in ("honest", "liar")]
        traffic = Traffic(h.client)
        repriced_at: list[bool] = []  # whether the liar was repriced as each was routed
        deadline = time.monotonic() + 60
        while len(traffic.routed) < 90 and time.monotonic() < deadline:
            while len(traffic.open) < traffic.concurrency and traffic.sent < 90:
                traffic.submit_one()
                h.pump()
                assert len(traffic.read()) == 1
                repriced_at.append(h.core.workers["liar"].served.repriced)
            now = time.monotonic()
            for f in fakes:
                f.step(now)
            h.pump()
            traffic.read()
            time.sleep(0.005)
        reply = _status(h)
        liar = next(w for w in reply.workers if w["id"] == "liar")
        assert "repriced" in liar["served"], liar["served"]
        assert "! liar: repriced: its served tokens show" in workers_table(reply)
        _explain_says_repriced(tmp_path, reply.workers)
        priced = liar["priced_decode_tok_s"]
        assert REAL_ROW_TOK_S / 3 < priced[0] < REAL_ROW_TOK_S * 3, priced  # near its real
        after = [wid for wid, r in zip(traffic.routed, repriced_at, strict=True) if r]
        assert len(after) >= 30, repriced_at
        # It shares, once repriced (a third went to the honest worker in two runs here).
        assert after.count("honest") >= len(after) // 5, after
        assert set(traffic.routed) == {"honest", "liar"}
    finally:
        h.close()


@pytest.mark.parametrize("ratio", [0.9, 0.5])
def test_an_honest_worker_is_not_repriced(ratio: float) -> None:
    """Claims within BORNE_OUT of what is served stand (a slow window is no lie)."""
    from tandem.broker.observed import Served

    s = Served()
    s.settle(0.0, True)
    for t in range(1, 8):
        s.elapse(float(t), None)
        s.credit(ratio)
    assert s.ratio == pytest.approx(ratio) and not s.repriced
