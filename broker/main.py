"""The router process entry point."""

from __future__ import annotations

import logging
import signal
import threading

import zmq
from prometheus_client import CollectorRegistry, disable_created_metrics, start_http_server

from tandem.broker.router import Router, RouterConfig
from tandem.common.affinity import pin
from tandem.common.fdlimit import raise_fd_limit
from tandem.common.settings import Addresses

log = logging.getLogger(__name__)


def run_router(cfg: RouterConfig, addresses: Addresses, stop: threading.Event | None = None) -> int:
    """Run the router with ``cfg``, bound at ``addresses``, until ``stop`` (or a signal)."""
    stop = stop or threading.Event()
    pin(cfg.cpus)
    raise_fd_limit()  # each client and worker connection holds a descriptor
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
    try:
        router = Router(cfg, addresses)
    except zmq.ZMQError as exc:
        log.error(
            "cannot bind %s / %s: %s (is another router running?)",
            addresses.client,
            addresses.worker,
            exc,
        )
        return 1
    if cfg.metrics_port is not None:
        try:
            serve_metrics(router.core.metrics.registry, cfg.metrics_port, cfg.metrics_host)
        except OSError as exc:
            log.error("cannot serve metrics on port %d: %s", cfg.metrics_port, exc)
            return 1
    router.serve(stop)
    return 0


def serve_metrics(registry: CollectorRegistry, port: int, host: str) -> int:
    """Serve /metrics on ``host:port`` from a daemon thread (the process's, not the
    core's: it reads the registry at scrape time); returns the bound port."""
    # The *_created series only repeat the process start time; vLLM drops them too.
    disable_created_metrics()
    server, _thread = start_http_server(port, addr=host, registry=registry)
    bound = int(server.server_port)
    log.info("router: metrics on http://%s:%d/metrics", host, bound)
    return bound
