"""Routing decisions are unchanged by hot-path work, and one core decides them
wherever it runs: a scripted, seeded session (submits, heartbeats with rows and
cache blocks, token deltas, finishes, under each policy) is replayed through the
live router (its loop on inproc sockets), through its core driven directly, and
through the twin's loop (twin/loop.py); every decision record of each (inputs:
each candidate's active/queued counts, cached tokens, P, D, rates; output: the
scores and the choice) must equal the one recorded from the live router before
its routing state became incremental (tests/fixtures/decisions_replay.json).

Regenerate the fixture only when a routing change is intended:
``python -m tests.unit.test_decision_replay --record``.
"""

from __future__ import annotations

import json
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tandem.common import protocol as p
from tandem.common.blocks import block_hashes
from tests.replay_links import LINKS, Link

FIXTURE = Path(__file__).parent.parent / "fixtures" / "decisions_replay.json"
SCENARIOS = {
    "phase_cost": {"policy": "phase_cost"},
    "phase_cost_ratio": {"policy": "phase_cost", "decode_estimate": "ratio"},
    "least_tokens": {"policy": "least_tokens"},
    "cache_aware": {"policy": "cache_aware"},
    "least_loaded": {"policy": "least_loaded"},
    "finish_time": {"policy": "finish_time"},
}
RATES = [
    (2551.0, [293.0, 533.0, 732.0, 902.0]),
    (73.0, [45.0, 58.0, 64.0, 68.0]),
    (210.0, [55.0, 70.0]),
    (900.0, [120.0, 200.0, 260.0]),
    (73.0, [45.0, 58.0, 64.0, 68.0]),
]
PREFIXES = [[(7 * i + 3 * k) % 997 + 1 for k in range(160)] for i in range(4)]
STEPS = 160


class Session:
    """Fake workers that remember what they were assigned and report it back, through
    one of the drivers of the router core (tests/replay_links.py)."""

    def __init__(self, link: Link, rng: random.Random) -> None:
        self.link, self.rng = link, rng
        self.assigned: dict[
            str, dict[str, list[Any]]
        ] = {}  # worker -> wid -> [tokens, budget, done]
        self.seq: dict[str, int] = {}
        self.n = 0

    def start(self) -> None:
        for i, rates in enumerate(RATES):
            wid = f"w{i}"
            self.link.start_worker(wid, rates, max_active=len(rates[1]))
            self.assigned[wid], self.seq[wid] = {}, 0

    def drain(self) -> None:
        """Collect the Assigns every worker was sent."""
        for wid, msg in self.link.assigned():
            self.assigned[wid][msg.request_id] = [msg.tokens, msg.sampling.max_tokens, 0]

    def step(self) -> None:
        action = self.rng.choices(["submit", "heartbeat", "tokens", "done"], [5, 2, 3, 2])[0]
        getattr(self, action)()
        self.drain()

    def submit(self) -> None:
        self.n += 1
        head = self.rng.choice(PREFIXES)[: self.rng.choice([0, 16, 48, 100, 160])]
        tail = [self.rng.randrange(1, 999) for _ in range(self.rng.randrange(1, 120))]
        budget = self.rng.choice([1, 8, 32, 64, 200])
        self.link.submit(
            p.Submit(f"r{self.n}", tokens=head + tail, sampling=p.SamplingParams(budget))
        )

    def _live(self) -> list[tuple[str, str]]:
        return sorted((w, r) for w, reqs in self.assigned.items() for r in reqs)

    def heartbeat(self) -> None:
        wid = self.rng.choice(sorted(self.assigned))
        reqs = sorted(self.assigned[wid].items())
        rows = []
        for rid, (tokens, budget, seen) in reqs:
            cached = self.rng.choice([0, 16, 32])
            left = self.rng.choice([0, len(tokens) // 2])
            rows.append(p.RequestRow(rid, len(tokens), cached, left, max(0, budget - seen)))
        split = self.rng.randrange(len(rows) + 1)
        blocks = [h for pre in PREFIXES[: self.rng.randrange(3)] for h in block_hashes(pre, 16)]
        self.seq[wid] += 1
        seq = self.seq[wid]
        cache = p.CacheReport(full=True, seq=seq, blocks=blocks)
        self.link.from_worker(
            wid, p.Heartbeat(wid, seq, rows[:split], rows[split:], 0, 8192, cache)
        )

    def tokens(self) -> None:
        live = self._live()
        if not live:
            return
        wid, rid = self.rng.choice(live)
        n = self.rng.randrange(1, 6)
        self.assigned[wid][rid][2] += n
        self.link.from_worker(wid, p.TokenDelta(rid, list(range(n)), "x" * n))

    def done(self) -> None:
        live = self._live()
        if not live:
            return
        wid, rid = self.rng.choice(live)
        _, budget, seen = self.assigned[wid].pop(rid)
        stats = p.DoneStats(output_tokens=seen, prompt_tokens=1, cached_tokens=0)
        reason = p.FinishReason.EOS if seen < budget else "length"
        self.link.from_worker(wid, p.Done(rid, reason, stats))


def run_scenario(
    cfg: dict[str, Any], tmp_path: Path, seed: int = 12, driver: str = "live"
) -> list[dict[str, Any]]:
    """Every decision record of one seeded session (``time`` removed), through
    ``driver``: the live loop on sockets, the core alone, or the twin's loop."""
    link = LINKS[driver](tmp_path, {"calibrate": False, **cfg})
    try:
        s = Session(link, random.Random(seed))
        s.start()
        for _ in range(STEPS):
            s.step()
        records = link.decisions()
    finally:
        link.close()
    for r in records:
        r.pop("time")
        # Logged since the fixture was recorded (lookahead's forecast input); none of
        # these policies reads it.
        r.pop("arrivals_before", None)
    return records


@pytest.mark.parametrize("driver", sorted(LINKS))
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_replayed_decisions_are_unchanged(name: str, driver: str, tmp_path: Path) -> None:
    """The same decisions, record for record, from the live router (its loop on
    sockets), its core driven directly, and the twin's loop on a virtual clock."""
    recorded = json.loads(FIXTURE.read_text())[name]
    replayed = run_scenario(SCENARIOS[name], tmp_path, driver=driver)
    assert len(replayed) == len(recorded) > 40
    pruned = sum(_unprune(before, after) for before, after in zip(recorded, replayed, strict=True))
    if name == "finish_time":  # recorded before pruning: the replay exercises it
        assert pruned > 0
    for before, after in zip(recorded, replayed, strict=True):
        assert after == before, f"decision for {before['request']} changed"


def _unprune(before: dict[str, Any], after: dict[str, Any]) -> int:
    """Candidates ``after`` logs as pruned (finish_time's branch and bound) had, in
    ``before``, an exact score at or above their logged bound and above the choice's:
    checked, then given that recorded score so the records compare whole. How many."""
    chosen = next(c["score"] for c in before["candidates"] if c["id"] == before["choice"])
    n = 0
    for old, new in zip(before["candidates"], after["candidates"], strict=True):
        if new.pop("pruned", False):
            assert chosen < new["score"] <= old["score"] * (1 + 1e-12), (before["request"], new)
            new["score"] = old["score"]
            n += 1
    return n


def _record() -> None:
    from tandem.broker.policies.finish import FinishTime

    # finish_time exact for every candidate: the replay checks its pruning against it.
    FinishTime.__init__.__defaults__ = (False,)
    out = {}
    for name, cfg in SCENARIOS.items():
        with tempfile.TemporaryDirectory() as d:
            out[name] = run_scenario(cfg, Path(d))
    FIXTURE.write_text(json.dumps(out, indent=0, sort_keys=True) + "\n")
    print(f"recorded {sum(len(v) for v in out.values())} decisions in {FIXTURE}")


if __name__ == "__main__" and "--record" in sys.argv:
    _record()
