"""The router core is sans-IO: time comes with its events, messages leave through ``out``.

Driven here with no socket and no sleep: a request waits for a first worker until
its deadline on the clock the events carry, a silent worker is given up when the
events say enough time passed, and the core's own modules read no clock and open
no socket (broker/core.py and the modules it is made of).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from tandem.broker.config import RouterConfig
from tandem.broker.core import RouterCore
from tandem.broker.outgoing import Kept
from tandem.common import protocol as p
from tests.helpers import fake_ready, tiny_tokenizer

BROKER = Path(__file__).resolve().parents[2] / "broker"
CORE_MODULES = ("core.py", "state.py", "membership.py", "routing.py", "outgoing.py", "starting.py")


def core(**cfg: Any) -> RouterCore:
    return RouterCore(RouterConfig(accept_hold_ms=0.0, **cfg))


def sent(c: RouterCore) -> list[tuple[bytes, p.Message]]:
    """What the core owes, as (peer, message) pairs, workers' first."""
    kept = Kept()
    c.flush(kept, float("inf"))
    return kept.workers + kept.clients


def test_a_request_waits_for_a_first_worker_until_its_deadline_on_the_events_clock() -> None:
    c = core(no_worker_wait_s=30.0)
    c.client(b"client", p.Submit("r1", tokens=[1, 2, 3], sampling=p.SamplingParams(4)), 1000.0)
    c.dispatch(1029.9)
    assert sent(c) == [] and len(c.pending) == 1
    c.dispatch(1030.1)
    ((peer, err),) = sent(c)
    assert peer == b"client" and isinstance(err, p.Error) and err.code == p.NO_WORKERS


def test_a_silent_worker_is_given_up_when_the_events_say_so_and_its_request_moves() -> None:
    c, spec = core(liveness_s=3.0), tiny_tokenizer()
    for wid in ("a", "b"):
        c.worker(wid.encode(), fake_ready(wid, (100.0, [50.0]), 1, spec), 0.0)
    sent(c)
    c.client(b"client", p.Submit("r1", tokens=[1, 2, 3], sampling=p.SamplingParams(4),
                                 worker="a"), 0.0)  # fmt: skip
    c.dispatch(0.0)
    (assign,) = [m for peer, m in sent(c) if peer == b"a" and isinstance(m, p.Assign)]
    c.tick(2.9)  # within the window (6 heartbeats of 0.5 s, at least 3 s)
    assert set(c.workers) == {"a", "b"}
    hb = p.Heartbeat("b", 1, [], [], 0, 8192, p.CacheReport(full=True, seq=1))
    c.worker(b"b", hb, 9.0)  # b speaks, a does not
    c.tick(10.0)
    assert set(c.workers) == {"b"}
    cancel = [m for peer, m in sent(c) if peer == b"a"]
    assert cancel == [p.Cancel(assign.request_id)]  # if a lives, it stops the request
    assert [r.lost_on for r in c.pending] == [["a"]]  # pinned to a: waits to fail or move


def test_the_core_reads_no_clock_and_opens_no_socket() -> None:
    for name in CORE_MODULES:
        tree = ast.parse((BROKER / name).read_text())
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not imported & {"zmq", "socket", "threading", "asyncio"}, name
        called = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        assert not called & {"monotonic", "time", "sleep", "perf_counter_ns"}, name
