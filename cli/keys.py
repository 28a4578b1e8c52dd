"""``tandem keys``: make the CURVE keys that authenticate workers and clients."""

from __future__ import annotations

import sys
from pathlib import Path

import click


@click.command()
@click.argument("folder", type=click.Path(file_okay=False, path_type=Path))
@click.option("--force", is_flag=True, help="Replace the keys already in FOLDER.")
@click.option(
    "--add",
    "add",
    type=(click.Choice(["worker", "client"]), str),
    default=None,
    metavar="ROLE NAME",
    help="Add one key pair NAME for a worker or client to an existing FOLDER.",
)
def keys(folder: Path, force: bool, add: tuple[str, str] | None) -> None:
    """Make (or extend) a keys folder: the router's key pair, a worker's and a client's.

    Then pass --keys FOLDER (or TANDEM_KEYS=FOLDER) to the router, every worker and
    every client. Another host needs only router.key and its own *.key_secret
    (docs/SECURITY.md).
    """
    from tandem.common.auth import add_key, make_keys

    try:
        made = add_key(folder, *add) if add else make_keys(folder, force)
    except (ValueError, OSError) as exc:
        click.echo(f"tandem keys: {exc}", err=True)
        sys.exit(2)
    for path in made:
        click.echo(str(path))
    click.echo(
        f"router: tandem router --keys {folder}; workers and clients: --keys {folder} "
        "(secret keys: keep *.key_secret private)",
        err=True,
    )
