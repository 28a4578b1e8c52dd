"""When the router polls before it sleeps (broker/spin.py): while polling catches
input; off after a poll that caught nothing, probed again after growing gaps."""

from __future__ import annotations

import math

import pytest
import zmq

from tandem.broker.spin import MAX_BACKOFF, AdaptiveSpin
from tandem.common import protocol as p
from tests.helpers import Harness

MAX = 500e-6


def test_a_short_wait_earns_a_probe_and_polling_stays_while_it_catches() -> None:
    spin = AdaptiveSpin(MAX)
    spin.waited(1.8e-3, caught=False)  # input soon, a late wake-up included
    assert spin.window_s == MAX
    for _ in range(10):
        spin.waited(300e-6, caught=True)
    assert spin.window_s == MAX


@pytest.mark.parametrize("seconds", [0.02, math.inf])  # input late, or none (a timeout)
def test_a_long_wait_earns_no_probe(seconds: float) -> None:
    spin = AdaptiveSpin(MAX)
    spin.waited(seconds, caught=False)
    assert spin.window_s == 0


def test_failed_probes_back_off_so_frequent_late_input_costs_little() -> None:
    """Input every 2 ms (heartbeats of many idle workers): every probe fails."""
    spin = AdaptiveSpin(MAX)
    polled = 0
    for _ in range(2000):
        polled += spin.window_s > 0
        spin.waited(2e-3, caught=False)
    assert polled < 2000 / MAX_BACKOFF + 10  # ~1 probe in 64 waits once backed off


def test_a_probe_that_catches_resets_the_backoff() -> None:
    spin = AdaptiveSpin(MAX)
    for _ in range(20):  # back off a few times
        spin.waited(2e-3, caught=False)
    while not spin.window_s:
        spin.waited(300e-6, caught=False)
    spin.waited(200e-6, caught=True)
    spin.waited(900e-6, caught=False)  # one miss: off, next probe after one wait
    spin.waited(300e-6, caught=False)
    spin.waited(300e-6, caught=False)
    assert spin.window_s == MAX


def test_a_zero_window_never_polls_and_the_window_is_bounded() -> None:
    spin = AdaptiveSpin(0.0)
    spin.waited(0.0, caught=False)
    assert spin.window_s == 0
    with pytest.raises(ValueError):
        AdaptiveSpin(0.5)


def _poller(router) -> zmq.Poller:
    poller = zmq.Poller()
    poller.register(router.client_sock.sock, zmq.POLLIN)
    poller.register(router.worker_sock.sock, zmq.POLLIN)
    return poller


def test_the_router_polls_first_and_keeps_polling_only_while_it_catches(tmp_path) -> None:
    h = Harness(tmp_path)
    try:
        r, poller = h.router, _poller(h.router)
        assert r.spin.max_s == 2e-3  # RouterConfig.spin_us's default
        r.spin.window_s = r.spin.max_s
        h.client.send(p.StatusQuery())  # input waiting: the poll catches it at once
        assert r.client_sock.sock in r._wait(poller)
        assert r.spin.window_s == r.spin.max_s
        r.drain_clients()
        assert r._wait(poller) == {}  # nothing comes: polled 2 ms, then slept 100
        assert r.spin.window_s == 0
        h.client.send(p.StatusQuery())  # a client's frame soon after: the next wait probes
        assert r.client_sock.sock in r._wait(poller)
        assert r.spin.window_s == 0  # not yet: a failed probe waits one wait first
        r.drain_clients()
        h.client.send(p.StatusQuery())
        r._wait(poller)
        assert r.spin.window_s == r.spin.max_s
    finally:
        h.close()


def test_an_idle_router_s_heartbeats_do_not_keep_it_polling(tmp_path) -> None:
    h = Harness(tmp_path)
    try:
        h.add_worker("a", (100.0, [50.0]))
        r, poller = h.router, _poller(h.router)
        r.spin.window_s = r.spin.max_s
        h.heartbeat("a", 1)  # pumped: read; the next one waits
        h.workers["a"].send(p.Heartbeat("a", 2, [], [], 0, 8192, {"full": True, "seq": 2}))
        assert r.worker_sock.sock in r._wait(poller)  # caught, but no request is out
        assert r.spin.window_s == 0
    finally:
        h.close()
