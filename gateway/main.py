"""The gateway process entry point: the ASGI app under uvicorn."""

from __future__ import annotations

import logging

import uvicorn

from tandem.client import Client, TandemError
from tandem.client.errors import HandshakeRefused, RouterUnavailable
from tandem.common.fdlimit import raise_fd_limit
from tandem.gateway.app import build_app
from tandem.gateway.config import GatewayConfig
from tandem.gateway.guard import ConnectionLimits, guarded_protocol

log = logging.getLogger(__name__)
PROBE_S = 2.0  # how long start-up waits for a router that does not answer
# Descriptors kept back from the connection cap: the listening socket, the router's
# sockets and ZeroMQ's own, logs, the Python runtime's files.
FD_RESERVE = 64


def connection_cap(cfg: GatewayConfig, fd_limit: int | None) -> int | None:
    """How many connections the gateway holds at once: the configured cap, else the
    descriptor limit less ``FD_RESERVE`` (at least 1), None where there is no limit."""
    if cfg.max_connections:
        return cfg.max_connections
    return None if fd_limit is None else max(1, fd_limit - FD_RESERVE)


def refused_by_router(cfg: GatewayConfig) -> str | None:
    """Why the router refuses this gateway's handshake (its keys), or None. A router
    that is away or slow is not refused: the gateway starts (``tandem serve`` starts
    the router beside it), says so in its log, and answers 503 naming the cause
    until the router is there."""
    try:
        with Client(cfg.router, connect_timeout_s=PROBE_S, retries=0, keys=cfg.keys) as c:
            c.status()
    except HandshakeRefused as exc:
        return exc.message
    except RouterUnavailable as exc:
        log.warning("gateway: %s; until one runs there, requests get 503", exc.message)
    except TandemError as exc:
        log.warning("gateway: the router at %s does not answer yet (%s)", cfg.router, exc)
    return None


def run_gateway(cfg: GatewayConfig, access_log: bool = False) -> int:
    """Serve until SIGINT/SIGTERM (uvicorn handles both); 1 when the port cannot be
    bound, 2 when the router refuses the gateway's keys (no request could pass)."""
    refused = refused_by_router(cfg)
    if refused is not None:
        log.error("gateway: %s", refused)
        return 2
    fd_limit = raise_fd_limit()
    limits = ConnectionLimits(
        cfg.header_timeout_s,
        cfg.body_timeout_s,
        cfg.max_connections_per_client,
        connection_cap(cfg, fd_limit),
    )
    if fd_limit is not None and limits.max_total is not None and limits.max_total > fd_limit:
        log.warning(
            "gateway: --max-connections %d is over the descriptor limit %d: past it, "
            "connections are reset instead of answered 503",
            limits.max_total,
            fd_limit,
        )
    server = uvicorn.Server(
        uvicorn.Config(
            build_app(cfg, limits),
            host=cfg.host,
            port=cfg.port,
            http=guarded_protocol(limits),
            access_log=access_log,
            log_config=None,  # keep the process's logging set-up (tandem --log-level)
            # No keep-alive cap beyond uvicorn's: SDK clients reuse connections.
            timeout_graceful_shutdown=5,
        )
    )
    log.info(
        "gateway: http://%s:%d/v1 -> router %s (at most %s connections)",
        cfg.host, cfg.port, cfg.router, limits.max_total or "unlimited",
    )  # fmt: skip
    server.run()
    # uvicorn exits the process itself on a bind failure; a clean stop lands here.
    return 0 if server.started else 1
