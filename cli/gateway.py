"""``tandem gateway``: the OpenAI-compatible HTTP API in front of a router."""

from __future__ import annotations

import sys

import click

from tandem.cli.options import client_addr, field_option, keys_option
from tandem.gateway.config import GatewayConfig


@click.command()
@client_addr
@click.option("--host", envvar="TANDEM_GATEWAY_HOST", default="127.0.0.1", show_default=True)
@click.option("--port", envvar="TANDEM_GATEWAY_PORT", type=int, default=8000, show_default=True)
@click.option(
    "--api-key",
    envvar="TANDEM_API_KEY",
    default=None,
    help="Require `Authorization: Bearer KEY` on /v1/* (off when unset).",
)
@click.option(
    "--model-alias",
    multiple=True,
    help="Another name clients may use for the served model (repeatable).",
)
@click.option(
    "--default-max-tokens",
    type=int,
    default=256,
    show_default=True,
    help="Output budget of a request that gives no max_tokens.",
)
@click.option(
    "--max-concurrent",
    type=int,
    default=256,
    show_default=True,
    help="Requests in flight through this gateway; beyond, 429.",
)
@click.option("--timeout-s", type=float, default=300.0, show_default=True)
@field_option(
    GatewayConfig, "header_timeout_s", "A request's headers must arrive this fast, else close."
)
@field_option(
    GatewayConfig, "body_timeout_s", "A request's body must follow its headers this fast."
)
@field_option(
    GatewayConfig,
    "max_connections_per_client",
    "Connections one client address may hold (raise it behind a proxy).",
)
@field_option(
    GatewayConfig,
    "max_connections",
    "Connections from all addresses at once; 0: the descriptor limit less a reserve.",
)
@field_option(GatewayConfig, "max_messages", "Chat messages one request may hold; beyond, 400.")
@keys_option
@click.option("--access-log/--no-access-log", default=False, show_default=True)
def gateway(
    router_addr: str,
    host: str,
    port: int,
    api_key: str | None,
    model_alias: tuple[str, ...],
    default_max_tokens: int,
    max_concurrent: int,
    timeout_s: float,
    header_timeout_s: float,
    body_timeout_s: float,
    max_connections_per_client: int,
    max_connections: int,
    max_messages: int,
    keys: str | None,
    access_log: bool,
) -> None:
    """Serve the OpenAI API (/v1/chat/completions, /v1/completions, /v1/models, /health)."""
    from tandem.common.auth import keys_dir
    from tandem.gateway.main import run_gateway

    try:
        cfg = GatewayConfig(
            router_addr,
            host,
            port,
            api_key,
            model_alias,
            default_max_tokens,
            max_concurrent,
            timeout_s,
            keys=str(keys_dir(keys)) if keys else None,  # a folder without keys: refused now
            header_timeout_s=header_timeout_s,
            body_timeout_s=body_timeout_s,
            max_connections_per_client=max_connections_per_client,
            max_connections=max_connections,
            max_messages=max_messages,
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    sys.exit(run_gateway(cfg, access_log))
