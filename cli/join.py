"""``tandem join ROUTER --token TOKEN``: this machine's devices serve for a router
elsewhere, admitted by a one-time token that ``tandem serve`` printed."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, NoReturn

import click

from tandem.cli.options import node_option
from tandem.cli.processes import worker as worker_command
from tandem.cli.serve import SERVE_DEFAULTS, _run_dir, worker_knobs

# Exit codes: 2 refused (the token, the router's identity, the model, a bad flag),
# 3 the network (nothing answered: a later try may get through).
REFUSED, NETWORK = 2, 3


@click.command()
@click.argument("router")
@click.option("--token", envvar="TANDEM_JOIN_TOKEN", required=True,
              help="The join token tandem serve printed (or TANDEM_JOIN_TOKEN: other users "
              "of this machine can read a command line, not your environment).")  # fmt: skip
@node_option
@click.option(
    "--model",
    default=None,
    help="This host's copy of the model, when the router serves a file of its own.",
)
@click.option(
    "--devices", default="auto", help="auto | cpu | gpu | metal | cuda | cuda:N, comma list."
)
@click.option("--run-dir", default=None, help="Folder for the logs [default: a new one].")
@click.option("--timeout-s", type=float, default=15.0, show_default=True,
              help="How long to wait for the router's join service.")  # fmt: skip
@worker_knobs(
    {**SERVE_DEFAULTS, "threads": "the cores less one and one per GPU worker, at least 1"}
)
def join(router: str, token: str, node: str, model: str | None, devices: str,
         run_dir: str | None, timeout_s: float, **knobs: Any) -> None:  # fmt: skip
    """Serve from this machine's devices (a worker each) for the router at ROUTER (the
    join address tandem serve printed), supervised and restarted until Ctrl-C."""
    from tandem.common.join import BadToken, JoinToken
    from tandem.common.nodes import checked_node, default_node
    from tandem.launcher import join as joining
    from tandem.launcher.devices import devices as local_devices
    from tandem.launcher.devices import pick, probe

    try:
        parsed = JoinToken.parse(token)
        node = checked_node(node) if node else default_node()
        found = pick(local_devices(probe()), devices)
    except (BadToken, ValueError) as exc:
        _fail(str(exc), REFUSED)
    labels = [d.label for d in found]
    try:
        joined = joining.join(router, parsed, node, labels, timeout_s)
    except joining.JoinFailed as exc:
        _fail(str(exc), NETWORK if isinstance(exc, joining.Unreachable) else REFUSED)
    served = _model(joined.answer, model)
    click.echo(f"✓ join     admitted by {router} as node {node}: {', '.join(labels)} "
               f"serve {joined.answer.model_name or 'the router model'}")  # fmt: skip
    _run(joined, found, node, served, {k: v for k, v in knobs.items() if v is not None}, run_dir)


def _model(answer: Any, given: str | None) -> str | None:
    """The --model for this host's workers: given, or what the router serves."""
    if given:
        from tandem.common.gguf_file import weights_digest

        path = Path(given).expanduser()
        if answer.weights and path.is_file() and weights_digest(path) != answer.weights:
            _fail(f"{given} holds other weights than the router's {answer.model_name}", REFUSED)
        return given
    if not answer.portable:
        _fail(f"the router serves {answer.model_name}, a file on its own host: copy it here "
              "and pass --model PATH", REFUSED)  # fmt: skip
    return answer.model or None


def _run(joined: Any, found: list, node: str, model: str | None, knobs: dict[str, Any],
         run_dir: str | None) -> None:  # fmt: skip
    from tandem.launcher.joinrun import JoinSupervisor, join_plan
    from tandem.launcher.screen import Screen

    try:
        plan = join_plan(found, node, joined.worker_addr, joined.keys, model, knobs,
                         worker_command)  # fmt: skip
    except ValueError as exc:
        _fail(str(exc), REFUSED)
    folder = _run_dir(run_dir)
    (folder / "plan.txt").write_text(plan.describe() + "\n")
    name = joined.answer.model_name or "the model"
    sys.exit(JoinSupervisor(plan, folder, Screen(), name, node).run())


def _fail(message: str, code: int) -> NoReturn:
    click.echo(f"tandem join: {message}", err=True)
    sys.exit(code)
