"""Memory per peer is bounded: what one worker may make the router hold, at the socket.

Fake workers are DealerSockets on the live router's loop (tests/helpers.py Harness).
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest
import zmq

from tandem.broker.config import RouterConfig
from tandem.broker.peerbounds import MAX_CACHE_BLOCKS, cache_limit_blocks
from tandem.broker.router import Router
from tandem.common import protocol as p
from tandem.common.settings import Addresses
from tandem.common.transport import DealerSocket
from tests.helpers import Harness

KV_TOKENS = 8192  # the fake's declared KV cells; blocks of 16 (tests/helpers.py fake_ready)


def _beat(h: Harness, wid: str, cache: p.CacheReport, seq: int) -> list[p.Message]:
    """Send one heartbeat carrying ``cache``; what the router answered."""
    h.workers[wid].send(p.Heartbeat(wid, seq, [], [], 0, KV_TOKENS, cache))
    h.pump()
    out = []
    while h.workers[wid].poll(0):
        out.append(h.workers[wid].recv())
    return out


def test_a_flood_of_delta_cache_reports_is_held_to_the_declared_capacity(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    try:
        h.add_worker("flood", (1000.0, [50.0]), max_active=1)
        limit = KV_TOKENS // 16 + 1
        assert _beat(h, "flood", p.CacheReport(full=True, seq=1), 1) == []
        answers = []
        for k in range(1, 11):  # 100,000 new hashes a report, as the reproduction sent
            added = list(range(k * 100_000, (k + 1) * 100_000))
            delta = p.CacheReport(full=False, base=k, seq=k + 1, added=added)
            answers += _beat(h, "flood", delta, k + 1)
        w = h.core.workers["flood"]
        assert len(w.cache.held) <= limit
        assert any(isinstance(m, p.ResyncCache) for m in answers)
        assert h.core.refusals.counts["over_capacity"] >= 1
        # Its resync, a full listing past the capacity, is refused as well.
        big = p.CacheReport(full=True, seq=50, blocks=list(range(limit + 1)))
        assert any(isinstance(m, p.ResyncCache) for m in _beat(h, "flood", big, 50))
        assert len(w.cache.held) <= limit
        # A listing longer than any worker's may be is refused by the decoder itself.
        huge = p.CacheReport(full=True, seq=51, blocks=list(range(MAX_CACHE_BLOCKS + 1)))
        (refused,) = _beat(h, "flood", huge, 51)
        assert isinstance(refused, p.Error) and "cache.blocks" in refused.message
    finally:
        h.close()


def test_a_worker_at_capacity_that_evicts_as_it_adds_is_not_refused(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    try:
        h.add_worker("full", (1000.0, [50.0]), max_active=1)
        limit = KV_TOKENS // 16 + 1
        assert _beat(h, "full", p.CacheReport(full=True, seq=1, blocks=list(range(limit))), 1) == []
        swap = p.CacheReport(full=False, base=1, seq=2, added=[10**6, 10**6 + 1], removed=[0, 1])
        assert _beat(h, "full", swap, 2) == []
        assert len(h.core.workers["full"].cache.held) == limit
    finally:
        h.close()


def test_a_declared_capacity_counts_the_cache_tiers_and_is_capped() -> None:
    tiers = p.CacheTiers(cache_capacity_tokens=4096, host_cache_capacity_tokens=1 << 16)
    cache = p.CacheReport(full=True, seq=1, tiers=tiers)
    hb = p.Heartbeat("w", 1, [], [], 0, 4096, cache)
    assert cache_limit_blocks(hb, 16) == (4096 + 4096 + (1 << 16)) // 16 + 1
    liar = p.Heartbeat("w", 1, [], [], 0, 1 << 40, p.CacheReport(full=True, seq=1))
    assert cache_limit_blocks(liar, 1) == MAX_CACHE_BLOCKS


@pytest.mark.parametrize("side", ["clients", "workers"])
def test_connections_per_address_are_capped_and_refusals_counted_and_logged_once(
    side: str, caplog: pytest.LogCaptureFixture
) -> None:
    cap = 3
    addrs = Addresses("tcp://127.0.0.1:0", "tcp://localhost:0")
    router = Router(RouterConfig(max_connections_per_address=cap), addrs)
    stop = threading.Event()
    loop = threading.Thread(target=router.serve, args=(stop,), daemon=True)
    loop.start()
    address = router.client_sock.address if side == "clients" else router.worker_sock.address
    # Anything a stranger sends is answered: status, or "I do not know you" (Reregister).
    empty = p.CacheReport(full=True, seq=1)
    ask = p.StatusQuery() if side == "clients" else p.Heartbeat("x", 1, [], [], 0, 1, empty)
    socks: list[DealerSocket] = []
    try:
        with caplog.at_level(logging.WARNING, logger="tandem.auth"):
            answered = []
            for i in range(cap + 2):  # one at a time: each counted before the next
                sock = DealerSocket(address, identity=f"peer{i}".encode())
                socks.append(sock)
                try:  # a connection refused before the send leaves no peer to queue for
                    sock.sock.send(p.encode(ask), zmq.NOBLOCK)
                except zmq.Again:
                    answered.append(False)
                    continue
                answered.append(sock.poll(2000))
        # The count lags the loop by the events it has not read: one more, or one less.
        assert cap - 1 <= sum(answered) <= cap + 1, answered
        assert answered[: cap - 1] == [True] * (cap - 1) and not any(answered[cap + 1 :])
        assert router.peers.refused[side] >= 2
        refusals = [r for r in caplog.records if "refusing connections from" in r.getMessage()]
        assert len(refusals) == 1 and "127.0.0.1" in refusals[0].getMessage()
        samples = router.core.metrics.connections_refused.collect()[0].samples
        assert any(s.labels == {"socket": side} and s.value >= 2 for s in samples)
        for sock in socks:  # closing them frees the address's slots
            sock.close()
        socks = []
        deadline = time.monotonic() + 10
        while router.peers.open.get((side, "127.0.0.1")) and time.monotonic() < deadline:
            time.sleep(0.05)  # until the loop has seen them close
        fresh = DealerSocket(address, identity=b"fresh")
        socks.append(fresh)
        fresh.send(ask)
        assert fresh.poll(5000)
    finally:
        for sock in socks:
            sock.close()
        stop.set()
        loop.join(10)
