"""Options and set-up shared by several ``tandem`` commands."""

from __future__ import annotations

import logging
import sys

import click

from tandem.common.settings import DEFAULT_CLIENT_ADDR


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname).1s %(name)s: %(message)s",
    )


client_addr = click.option(
    "--router",
    "router_addr",
    envvar="TANDEM_CLIENT_ADDR",
    default=DEFAULT_CLIENT_ADDR,
    show_default=True,
    help="The router's client address.",
)

keys_option = click.option(
    "--keys",
    envvar="TANDEM_KEYS",
    default=None,
    type=click.Path(file_okay=False),
    help="CURVE keys folder made by `tandem keys` (docs/SECURITY.md); default: none.",
)

# Shared by `tandem worker` and `tandem profile`.
sim_profile = click.option(
    "--profile",
    "profile_file",
    default=None,
    help="sim backend: the device profile (a JSON file, or a bundled name such as gpu-m2).",
)
