"""``tandem sim``: the bench, replayed in the virtual-time twin (twin/).

``tandem sim [BENCH OPTIONS]`` takes the bench's own options (sim workers only;
``--worker sim:gpu-m2:join_s=2`` joins a worker 2 s after the first arrival)
and writes a bench-shaped result folder in seconds. ``tandem sim validate
RESULT.json`` replays a recorded bench result with sim workers in the twin and
compares makespans and placements case by case. ``tandem sim robustness``
runs the robustness suite.
"""

from __future__ import annotations

import logging
from datetime import datetime
from pathlib import Path
from typing import Any

import click

from tandem.cli.bench import bench, build_config, command_line
from tandem.cli.extras import BENCH_MODULES, require_extra
from tandem.cli.options import out_file_option

_SKIP = {"rates", "transport", "keep_token_times", "no_progress", "out_dir"}  # bench-only


def _encoder() -> Any:
    from tandem.common.model_files import default_model_path
    from tandem.common.tokenizer import TextTokenizer, tokenizer_spec_from_gguf

    return TextTokenizer(tokenizer_spec_from_gguf(default_model_path())).encode


def _option(flag: str, help: str, name: str | None = None, **kw: Any) -> click.Option:
    return click.Option([flag, name] if name else [flag], help=help, show_default=True, **kw)


@click.pass_context
def _sim(ctx: click.Context, /, **opts: Any) -> None:
    """Replay bench workloads in the virtual-time twin (sim workers; seconds, not minutes)."""
    require_extra("bench", BENCH_MODULES, "tandem sim")
    if ctx.invoked_subcommand is not None:
        return
    from tandem.bench.report import headline
    from tandem.twin.sim import run_sim
    from tandem.twin.world import Links

    try:
        cfg = build_config(ctx, {**opts, "rates": "advertised", "transport": "ipc",
                                 "keep_token_times": False})  # fmt: skip
        links = Links(opts["latency_ms"] / 1000, opts["heartbeat_delay_s"])
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    out = Path(opts["out_dir"] or f"sim-results/{stamp}")
    doc = run_sim(
        cfg, _encoder(), out, command_line(ctx).replace("tandem bench", "tandem sim"), links
    )
    for group in doc["groups"]:
        click.echo(f"{group['label']}: {headline(group) or '-'}", err=True)
    click.echo(f"wrote {out}/result.json, report.md and plots ({doc['wall_s']:.1f} s)", err=True)


sim = click.Group(
    "sim",
    callback=_sim,
    invoke_without_command=True,
    params=[
        *(p for p in bench.params if p.name not in _SKIP),
        _option(
            "--out",
            "Result folder [default: sim-results/DATE-TIME].",
            "out_dir",
            type=click.Path(file_okay=False),
            default=None,
        ),
        _option("--latency-ms", "Message delay each way (virtual).", type=float, default=0.0),
        _option(
            "--heartbeat-delay-s",
            "Extra delay of heartbeats: the router prices stale load.",
            type=float,
            default=0.0,
        ),
    ],
    help=_sim.__doc__,
)


@sim.command("validate")
@click.argument("results", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@out_file_option("--out", "out_file", help="Write the comparison as markdown here too.")
def validate(results: tuple[str, ...], out_file: str | None) -> None:
    """Replay recorded sim bench RESULTS in the twin; compare makespans and placements."""
    import json

    from tandem.twin.validate import compare, render

    rows = []
    for path in results:
        rows += compare(json.loads(Path(path).read_text()), _encoder(), source=path)
    text = render(rows)
    click.echo(text)
    if out_file:
        Path(out_file).write_text(text)


@sim.command("robustness")
@click.option("--policy", "policies", multiple=True, help="Policies to test [default: all].")
@click.option("--small", is_flag=True, help="The CI-sized suite (a 16-burst).")
@click.option(
    "--warmup/--no-warmup",
    default=True,
    show_default=True,
    help="Workers measure themselves at start, as real workers do by default.",
)
@out_file_option("--out", "out_file")
def robustness(policies: tuple[str, ...], small: bool, warmup: bool, out_file: str | None) -> None:
    """Fool the router (noisy, wrong and stale prices, a late worker) and compare policies."""
    from tandem.twin.robustness import render, run_suite

    # Each replay's workers measure themselves and say where the rates they were told are off:
    # that is the point of the scenarios, not news.
    logging.getLogger("tandem.workers.rates").setLevel(logging.ERROR)
    text = render(run_suite(_encoder(), policies or None, small=small, warmup=warmup))
    click.echo(text)
    if out_file:
        Path(out_file).write_text(text)
