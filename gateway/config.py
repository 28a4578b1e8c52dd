"""The gateway's settings: one frozen dataclass the CLI fills from flags / TANDEM_* vars."""

from __future__ import annotations

from dataclasses import dataclass

from tandem.common.validation import MAX_MESSAGES


@dataclass(frozen=True)
class GatewayConfig:
    router: str  # the router's client address
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None  # when set, /v1/* needs `Authorization: Bearer <key>`
    model_aliases: tuple[str, ...] = ()  # extra names accepted for the served model
    default_max_tokens: int = 256  # when a request gives neither max_tokens field
    max_concurrent: int = 256  # requests in flight through this gateway; beyond: 429
    request_timeout_s: float = 300.0  # silence from the router before a request fails
    status_ttl_s: float = 1.0  # how long a router status answers model / health checks
    max_body_bytes: int = 4 * 1024 * 1024  # larger request bodies get 413
    # Chat messages in one request (more get 400, counted before the body is parsed);
    # the router refuses more than common/validation.MAX_MESSAGES from any client.
    max_messages: int = MAX_MESSAGES
    keys: str | None = None  # the router's CURVE keys folder (docs/SECURITY.md)
    # Slow clients (gateway/guard.py): a request's headers must be in this long after
    # its first byte (or after the connection opens), its body this long after them
    # (4 MiB in 30 s: 140 KB/s), else the connection is closed.
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    # Connections one client address may hold open (one more gets 429 and a close):
    # as many as the requests the gateway admits. Behind a proxy every client shares
    # its address: raise it there.
    max_connections_per_client: int = 256
    # Connections open at once, from every address (one more gets 503 and a close);
    # 0: as many as the descriptor limit allows, less a reserve for the gateway's own
    # files and router sockets (gateway/main.py raises that limit first).
    max_connections: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError("port must be in 0..65535")
        if self.api_key is not None and not self.api_key:
            raise ValueError("api_key must not be empty (leave it unset to disable keys)")
        if self.default_max_tokens < 1 or self.max_concurrent < 1:
            raise ValueError("default_max_tokens and max_concurrent must be >= 1")
        if self.request_timeout_s <= 0 or self.status_ttl_s < 0:
            raise ValueError("request_timeout_s must be > 0 and status_ttl_s >= 0")
        if self.max_body_bytes < 1024:
            raise ValueError("max_body_bytes must be >= 1024")
        if not 1 <= self.max_messages <= MAX_MESSAGES:
            raise ValueError(f"max_messages must be in 1..{MAX_MESSAGES} (the router's bound)")
        if not (self.header_timeout_s > 0 and self.body_timeout_s > 0):
            raise ValueError("header_timeout_s and body_timeout_s must be > 0")
        if self.max_connections_per_client < 1:
            raise ValueError("max_connections_per_client must be >= 1")
        if self.max_connections < 0:
            raise ValueError("max_connections must be >= 0 (0: from the descriptor limit)")
        if "://" not in self.router:
            raise ValueError(f"router address {self.router!r} needs a scheme (tcp://, ipc://)")
