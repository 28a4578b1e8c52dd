"""A fake worker that serves at a fixed speed whatever it claims, and a client that
keeps requests flowing: tests/unit/test_peer_claims.py at the live loop's sockets,
studies/peer_bounds.py against a router process. ``step`` and ``submit_some`` do
what is due now and return; the caller's loop owns time (and pumps a Harness)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tandem.common import protocol as p
from tandem.common.transport import DealerSocket

REAL_ROW_TOK_S = 40.0  # what each fake serves per decoding row
PREFILL_TOK_S = 4000.0
HONEST = [REAL_ROW_TOK_S * b for b in range(1, 5)]  # aggregate tok/s at batch 1..4


@dataclass
class FakeWorker:
    """Serves at REAL_ROW_TOK_S per row, up to ``slots`` rows, whatever it claims."""

    wid: str
    sock: DealerSocket
    slots: int = 4
    queue: list[tuple[str, int, int]] = field(default_factory=list)  # (wid, prompt, max)
    rows: dict[str, list[float]] = field(default_factory=dict)  # wid -> [start, sent, max]
    hb_at: float = 0.0
    seq: int = 0

    def step(self, now: float) -> None:
        while self.sock.poll(0):
            msg = self.sock.recv()
            if isinstance(msg, p.Assign):
                self.queue.append((msg.request_id, len(msg.tokens), msg.sampling.max_tokens))
        while self.queue and len(self.rows) < self.slots:
            rid, prompt, budget = self.queue.pop(0)
            self.rows[rid] = [now + prompt / PREFILL_TOK_S, 0, budget]
        for rid, row in list(self.rows.items()):
            due = min(row[2], 1 + int((now - row[0]) * REAL_ROW_TOK_S)) if now >= row[0] else 0
            if due > row[1]:
                self.sock.send(p.TokenDelta(rid, [7] * (due - int(row[1])), "x"))
                row[1] = due
            if row[1] >= row[2]:
                stats = p.DoneStats(output_tokens=int(row[2]))
                self.sock.send(p.Done(rid, p.FinishReason.LENGTH, stats))
                del self.rows[rid]
        if now - self.hb_at > 0.2:
            self.hb_at, self.seq = now, self.seq + 1
            cache = p.CacheReport(full=True, seq=self.seq)
            self.sock.send(p.Heartbeat(self.wid, self.seq, [], [], 0, 8192, cache))


@dataclass
class Traffic:
    """A client keeping ``concurrency`` requests of 40 prompt tokens open."""

    sock: DealerSocket
    concurrency: int = 6
    routed: list[str] = field(default_factory=list)  # the worker of each, in order
    open: set[str] = field(default_factory=set)
    sent: int = 0

    def submit_one(self) -> str:
        rid, self.sent = f"r{self.sent}", self.sent + 1
        self.sock.send(p.Submit(rid, tokens=[3] * 40, sampling=p.SamplingParams(20)))
        self.open.add(rid)
        return rid

    def read(self) -> list[p.Accepted]:
        """What the client was sent: Accepteds returned (and noted), Dones closing."""
        accepted = []
        while self.sock.poll(0):
            msg = self.sock.recv()
            if isinstance(msg, p.Done):
                self.open.discard(msg.request_id)
            elif isinstance(msg, p.Accepted):
                accepted.append(msg)
                self.routed.append(msg.worker_id)
            elif not isinstance(msg, p.TokenDelta):
                raise AssertionError(f"unexpected {msg}")
        return accepted
