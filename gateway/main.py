"""The gateway process entry point: the ASGI app under uvicorn."""

from __future__ import annotations

import logging

import uvicorn

from tandem.gateway.app import build_app
from tandem.gateway.config import GatewayConfig

log = logging.getLogger(__name__)


def run_gateway(cfg: GatewayConfig, access_log: bool = False) -> int:
    """Serve until SIGINT/SIGTERM (uvicorn handles both); 1 when the port cannot be bound."""
    server = uvicorn.Server(
        uvicorn.Config(
            build_app(cfg),
            host=cfg.host,
            port=cfg.port,
            access_log=access_log,
            log_config=None,  # keep the process's logging set-up (tandem --log-level)
            # No keep-alive cap beyond uvicorn's: SDK clients reuse connections.
            timeout_graceful_shutdown=5,
        )
    )
    log.info("gateway: http://%s:%d/v1 -> router %s", cfg.host, cfg.port, cfg.router)
    server.run()
    # uvicorn exits the process itself on a bind failure; a clean stop lands here.
    return 0 if server.started else 1
