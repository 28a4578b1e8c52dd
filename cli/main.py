"""The ``tandem`` command group. Each command lives in the module of its group and
is registered here; progress goes to stderr, answers (tables, ``--json``) to stdout."""

from __future__ import annotations

import click

from tandem.cli.bench import bench
from tandem.cli.gateway import gateway
from tandem.cli.join import join
from tandem.cli.keys import keys
from tandem.cli.options import setup_logging
from tandem.cli.processes import router, worker
from tandem.cli.profile import profile
from tandem.cli.route import decisions, route
from tandem.cli.serve import serve
from tandem.cli.sim import sim
from tandem.cli.top import top
from tandem.cli.use import generate, status
from tandem.common.settings import env_str


@click.group()
# The installed distribution's version (pyproject.toml), not a copy kept in the code.
@click.version_option(package_name="tandem-serve", prog_name="tandem")
@click.option("--log-level", default=lambda: env_str("LOG_LEVEL", "info"), show_default="info")
def main(log_level: str) -> None:
    """tandem: one model served from CPU and GPU workers behind one router."""
    setup_logging(log_level)


for command in (
    serve,
    join,
    router,
    worker,
    gateway,
    generate,
    status,
    top,
    profile,
    route,
    decisions,
    bench,
    keys,
    sim,
):
    main.add_command(command)
