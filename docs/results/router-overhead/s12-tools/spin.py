"""A lone request's round trip through the router as shipped (sleeping in its poll) and
through one that spins (poll timeout 0, no idle gather): how much of the router's added
time is waking up. usage: spin.py N ROUNDS (run from this folder)."""

import logging
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "s11-tools"))
from lone_path import lone_path, serve  # noqa: E402

from tandem.bench import router_overhead as ro  # noqa: E402


def _router(client, worker):
    from tandem.broker.router import Router, RouterConfig
    from tandem.common.settings import Addresses

    logging.basicConfig(level=logging.ERROR)
    return Router, RouterConfig(addresses=Addresses(client, worker))


def plain_router(client, worker, stop):
    cls, cfg = _router(client, worker)
    serve(cls(cfg), stop)


def spin_router(client, worker, stop):
    import tandem.broker.router as rm

    cls, cfg = _router(client, worker)
    rm.IDLE_GATHER_MS = 0

    class Spinning(cls):
        def _poll_ms(self):
            return 0

    serve(Spinning(cfg), stop)


def lone_requests(sock, n):
    """Round trips (ms) of ``n`` requests sent one at a time."""
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        sock.send(ro._submit(f"z{i}", 1))
        while True:
            sock.poll(10000)
            if any(m.get("type") == "done" for m in ro._messages(sock.recv())):
                break
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def median_ms(target, n):
    with lone_path(target) as (sock, _):
        return statistics.median(lone_requests(sock, n)[n // 10 :])


if __name__ == "__main__":
    n, rounds = int(sys.argv[1]), int(sys.argv[2])
    for _ in range(rounds):
        plain, spin = median_ms(plain_router, n), median_ms(spin_router, n)
        print(f"plain {plain:.3f} ms  spin {spin:.3f} ms", flush=True)
