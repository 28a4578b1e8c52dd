"""What lone_split.py and lone_calls.py share: the bench's router path
(bench/router_overhead.py ``path``) with a router of the tool's making."""

import threading
from contextlib import contextmanager

import zmq

from tandem.bench import null_peers
from tandem.bench import router_overhead as ro


def serve(router, stop):
    """Serve ``router`` until the bench's ``stop`` event is set (as ``_run_router``)."""
    local = threading.Event()
    threading.Thread(target=lambda: (stop.wait(), local.set()), daemon=True).start()
    router.serve(local)


@contextmanager
def lone_path(router_target):
    """A client DEALER warmed on ``router_target(client, worker, stop)`` in its own
    process, a null worker behind it; yields (socket, [router, worker] processes)."""
    c, w = ro._addr(), ro._addr()
    with ro._processes((router_target, (c, w)), (null_peers.null_worker, (w, "router"))) as procs:
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(c)
        try:
            ro._warm(sock, procs=procs)
            yield sock, procs
        finally:
            sock.close(0)
