"""Options the bench's commands share, below the cli room so the benches that run as
``python -m tandem.bench.X`` need nothing of the ``tandem`` command's package."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click


def _out_file(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """An output file's folder is made, and found writable, before a long run starts
    rather than when its result is written at the end."""
    if value is None:
        return None
    folder = Path(value).resolve().parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        why = exc.strerror or exc
        raise click.BadParameter(f"cannot make the folder {str(folder)!r}: {why}") from None
    if not os.access(folder, os.W_OK):
        raise click.BadParameter(f"the folder {str(folder)!r} is not writable")
    return value


def out_file_option(*names: str, help: str = "Write the result to this file.") -> Any:
    """``--out FILE``: its folder made (and checked) when the command starts."""
    return click.option(
        *(names or ("--out",)),
        type=click.Path(dir_okay=False),
        default=None,
        callback=_out_file,
        help=help,
    )
