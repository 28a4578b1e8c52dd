"""What a worker claims is held to physics and to what it serves, at the socket.

Fake workers are DealerSockets on the live router's loop (tests/helpers.py Harness):
every frame below is one an outside peer could send.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tandem.broker.policies import WorkerView
from tandem.broker.policies.finish import predict_finish_s
from tandem.broker.policies.views import RouteRequest
from tandem.common import protocol as p
from tandem.common.pricing import price
from tandem.common.steptime import StepModel
from tandem.common.validation import MAX_RATE_TOK_S, MIN_STEP_S
from tests.helpers import Harness, fake_ready


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


def test_nothing_derived_from_bounded_reports_is_inf_or_nan() -> None:
    fastest = StepModel((1, 4096), (MIN_STEP_S, MIN_STEP_S), (64, 64))
    rates = price(MAX_RATE_TOK_S, [MAX_RATE_TOK_S] * 4096, 4096, fastest)
    assert all(math.isfinite(x) and 0 < x <= MAX_RATE_TOK_S for x in rates.decode_tok_s)
    # A view priced at infinity (a report no bound stopped) must not divide by zero.
    view = WorkerView("w", math.inf, (math.inf,), max_active=1)
    assert predict_finish_s(RouteRequest(100, 10), view) >= 0


# ------------------------------------------------------------ a worker that lies
REAL_ROW_TOK_S = 40.0  # what each fake serves per decoding row
PREFILL_TOK_S = 4000.0


@dataclass
class FakeWorker:
    """Serves at REAL_ROW_TOK_S per row, up to ``slots`` rows, whatever it claims."""

    wid: str
    slots: int
    queue: list[tuple[str, int, int]] = field(default_factory=list)  # (wid, prompt, max)
    rows: dict[str, list[float]] = field(default_factory=dict)  # wid -> [start, sent, max]
    served: int = 0
    hb_at: float = 0.0
    seq: int = 0

    def step(self, h: Harness, now: float) -> None:
        sock = h.workers[self.wid]
        while sock.poll(0):
            msg = sock.recv()
            if isinstance(msg, p.Assign):
                self.queue.append((msg.request_id, len(msg.tokens), msg.sampling.max_tokens))
        while self.queue and len(self.rows) < self.slots:
            rid, prompt, budget = self.queue.pop(0)
            self.rows[rid] = [now + prompt / PREFILL_TOK_S, 0, budget]
        for rid, row in list(self.rows.items()):
            due = min(row[2], 1 + int((now - row[0]) * REAL_ROW_TOK_S)) if now >= row[0] else 0
            if due > row[1]:
                sock.send(p.TokenDelta(rid, [7] * (due - int(row[1])), "x"))
                row[1] = due
            if row[1] >= row[2]:
                sock.send(p.Done(rid, p.FinishReason.LENGTH, p.DoneStats(output_tokens=row[2])))
                del self.rows[rid]
                self.served += 1
        if now - self.hb_at > 0.2:
            self.hb_at, self.seq = now, self.seq + 1
            cache = p.CacheReport(full=True, seq=self.seq)
            sock.send(p.Heartbeat(self.wid, self.seq, [], [], 0, 8192, cache))


def _drain_client(h: Harness, open_ids: set[str]) -> list[p.Accepted]:
    """What the client was sent: Accepteds returned, Dones closing their requests."""
    accepted = []
    while h.client.poll(0):
        msg = h.client.recv()
        if isinstance(msg, p.Done):
            open_ids.discard(msg.request_id)
        elif isinstance(msg, p.Accepted):
            accepted.append(msg)
        else:
            assert isinstance(msg, p.TokenDelta), msg
    return accepted


def test_a_worker_claiming_100x_its_speed_is_repriced_and_does_not_take_all_traffic(
    tmp_path: Path,
) -> None:
    h = Harness(tmp_path, policy="finish_time")
    honest = [REAL_ROW_TOK_S * b for b in range(1, 5)]
    try:
        h.add_worker("honest", (PREFILL_TOK_S, honest), max_active=4)
        h.add_worker("liar", (PREFILL_TOK_S * 100, [x * 100 for x in honest]), max_active=4)
        fakes = [FakeWorker("honest", 4), FakeWorker("liar", 4)]
        routed: list[tuple[str, bool]] = []  # (worker, liar repriced when routed)
        open_ids: set[str] = set()
        deadline = time.monotonic() + 60
        while len(routed) < 90 and time.monotonic() < deadline:
            while len(open_ids) < 6 and len(routed) < 90:
                rid = f"r{len(routed)}"
                h.client.send(p.Submit(rid, tokens=[3] * 40, sampling=p.SamplingParams(20)))
                h.pump()
                accepted = _drain_client(h, open_ids)
                assert len(accepted) == 1, accepted
                routed.append((accepted[0].worker_id, h.core.workers["liar"].served.repriced))
                open_ids.add(rid)
            now = time.monotonic()
            for f in fakes:
                f.step(h, now)
            h.pump()
            _drain_client(h, open_ids)
            time.sleep(0.005)
        liar = next(w for w in _status(h).workers if w["id"] == "liar")
        assert "repriced" in liar["served"], liar["served"]
        priced = liar["priced_decode_tok_s"]
        assert REAL_ROW_TOK_S / 3 < priced[0] < REAL_ROW_TOK_S * 3, priced  # near its real
        after = [wid for wid, repriced in routed if repriced]
        assert len(after) >= 30, routed
        assert after.count("honest") >= len(after) // 4, after  # it shares, once repriced
        assert {wid for wid, _ in routed} == {"honest", "liar"}
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
