"""A lone request's round trip through routers as configured (``spin_us``) and one that
never sleeps, alternating: medians of N lone requests a router, ROUNDS rounds.
usage: adaptive.py N ROUNDS SPIN_US [SPIN_US ...] (run from this folder)."""

import functools
import logging
import sys

from spin import median_ms, serve, spin_router


def configured_router(client, worker, stop, spin_us=500.0):
    from tandem.broker.router import Router, RouterConfig
    from tandem.common.settings import Addresses

    logging.basicConfig(level=logging.ERROR)
    serve(Router(RouterConfig(addresses=Addresses(client, worker), spin_us=spin_us)), stop)


def _named(spin_us):
    target = functools.partial(configured_router, spin_us=spin_us)
    target.__name__ = f"spin_us={spin_us:g}"  # the bench names its processes after targets
    return target


if __name__ == "__main__":
    n, rounds = int(sys.argv[1]), int(sys.argv[2])
    targets = [_named(float(us)) for us in sys.argv[3:]] + [spin_router]
    for _ in range(rounds):
        row = [f"{t.__name__} {median_ms(t, n):.3f}" for t in targets]
        print("  ".join(row), flush=True)
