"""Options and set-up shared by several ``tandem`` commands."""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from pathlib import Path
from typing import Any

import click

from tandem.common.settings import DEFAULT_CLIENT_ADDR


def config_default(cls: type, name: str) -> Any:
    """The default of field ``name`` of config dataclass ``cls``: every setting's
    default is written once, on the dataclass, and the CLI shows that one."""
    for f in dataclasses.fields(cls):
        if f.name == name:
            if f.default is not dataclasses.MISSING:
                return f.default
            if f.default_factory is not dataclasses.MISSING:
                return f.default_factory()
            raise ValueError(f"{cls.__name__}.{name} has no default")
    raise ValueError(f"{cls.__name__} has no field {name!r}")


def field_option(cls: type, name: str, help: str | None = None, **kw: Any) -> Any:
    """A ``--name`` option for config field ``name``: its type and default from ``cls``."""
    default = config_default(cls, name)
    kw.setdefault("type", type(default))
    return click.option(
        "--" + name.replace("_", "-"), default=default, show_default=True, help=help, **kw
    )


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

# A worker's machine (Ready.node), the same flag on `tandem worker` and `tandem join`;
# the Ray fleet sets TANDEM_NODE for the workers it starts.
node_option = click.option(
    "--node",
    envvar="TANDEM_NODE",
    default="",
    help="The machine's name in status, top and /metrics [default: the host's name].",
)

# `tandem status` / `tandem top`: find the router of a `tandem serve --ray` through Ray.
ray_option = click.option(
    "--ray",
    "ray_address",
    default=None,
    is_flag=False,
    flag_value="auto",
    metavar="[ADDRESS]",
    help="Ask the Ray cluster at ADDRESS (auto: this host's) where the fleet's router is, "
    "and for its client keys (tandem serve --ray).",
)


def via_ray(ray_address: str | None, router_addr: str, keys: str | None) -> tuple[str, str | None]:
    """The router's address and keys folder: as given, or from the fleet on Ray (its
    keys in a private folder removed when the command ends)."""
    if ray_address is None:
        return router_addr, keys
    from tandem.fleet import RayMissing
    from tandem.fleet.access import NoFleet, router_access

    try:
        client, folder, cleanup = router_access(ray_address)
    except (RayMissing, NoFleet, ConnectionError) as exc:
        raise click.ClickException(str(exc)) from None
    click.get_current_context().call_on_close(cleanup)
    return client, str(folder)


# Shared by `tandem worker` and `tandem profile`.
sim_profile = click.option(
    "--profile",
    "profile_file",
    default=None,
    help="sim backend: the device profile (a JSON file, or a bundled name such as gpu-m2).",
)


def _cpus(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    from tandem.common.affinity import parse_cpus

    try:
        return parse_cpus(value) if value else None
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


# Shared by `tandem router` and `tandem worker`.
cpus_option = click.option(
    "--cpus",
    default=None,
    callback=_cpus,
    help="Pin the process to these cores, e.g. 0-9,12 [default: any core].",
)


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
