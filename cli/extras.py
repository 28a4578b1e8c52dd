"""Commands that need an optional extra say which one, instead of an ImportError."""

from __future__ import annotations

from importlib.util import find_spec

import click

# What the `bench` extra (pyproject.toml) brings: plots and the progress bar of
# `tandem bench` and `tandem sim`, kept out of the client's install.
BENCH_MODULES = ("matplotlib", "tqdm")


def require_extra(extra: str, modules: tuple[str, ...], command: str) -> None:
    """Stop ``command`` with the pip line to run when any of ``modules`` is missing.

    find_spec looks without importing, so the check costs nothing when all are there."""
    missing = [m for m in modules if find_spec(m) is None]
    if missing:
        raise click.ClickException(
            f"{command} needs {', '.join(missing)}, from the {extra} extra: "
            f"pip install 'tandem-serve[{extra}]' (in a checkout: pip install -e '.[{extra}]')"
        )
