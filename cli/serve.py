"""``tandem serve [MODEL]``: the router, one worker per device and the gateway, from
one command; the machinery is in launcher/ (devices, plan, supervisor)."""

from __future__ import annotations

import os
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import click

from tandem.cli.gateway import gateway as gateway_command
from tandem.cli.processes import router as router_command
from tandem.cli.processes import worker as worker_command
from tandem.launcher.plan import CPU_MAX_ACTIVE, GPU_MAX_ACTIVE, option_keys

# The commands whose options a plan's config keys are, and whose parsers check them.
COMMANDS = {"router": router_command, "worker": worker_command, "gateway": gateway_command}

# `tandem worker` flags `tandem serve` takes as its own, for every local worker; any
# other flag of any process: --set SECTION.KEY=VALUE or the config file.
WORKER_KNOBS = ("threads", "max_active", "n_ctx", "step_tokens", "step_budget_x", "cache_tokens",
                "warmup")  # fmt: skip
RUNS_KEPT = 20  # run folders (logs) kept under the cache root


# What serve picks per device when a knob is not given (launcher/plan.py).
SERVE_DEFAULTS = {
    "threads": "the cores less one each for the router, the gateway and every GPU "
    "worker's host thread, at least 1",
    "max_active": f"{CPU_MAX_ACTIVE} on a CPU, {GPU_MAX_ACTIVE} on a GPU",
}


def _worker_knobs(f: Any) -> Any:
    options = option_keys(worker_command)
    for name in reversed(WORKER_KNOBS):
        opt = options[name]
        text = f"Every worker: {opt.help or name}"
        if name in SERVE_DEFAULTS:
            text += f" [default: {SERVE_DEFAULTS[name]}]"
        f = click.option(*opt.opts, type=opt.type, default=None, help=text)(f)
    return f


def _sets(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict:
    """``router.spin_us=0`` -> {"router": {"spin_us": 0}}; values read as TOML, else text."""
    out: dict[str, dict[str, Any]] = {}
    for item in values:
        key, eq, text = item.partition("=")
        section, dot, name = key.partition(".")
        if not (eq and dot and name) or section not in ("router", "gateway", "worker"):
            raise click.BadParameter(f"{item!r}: want router|gateway|worker.KEY=VALUE")
        try:
            value = tomllib.loads(f"v = {text}")["v"]
        except tomllib.TOMLDecodeError:
            value = text
        out.setdefault(section, {})[name.replace("-", "_")] = value
    return out


@click.command()
@click.argument("model", required=False)
@click.option("--config", "config_file", type=click.Path(dir_okay=False), help="A tandem.toml.")
@click.option("--print-config", is_flag=True, help="Write the effective config (TOML) and exit.")
@click.option("--dry-run", is_flag=True, help="Print the processes and their flags; start none.")
@click.option(
    "--devices", default=None, help="auto | cpu | gpu | metal | cuda | cuda:N, comma list."
)
@click.option("--host", default=None, help="Gateway address [default: 127.0.0.1].")
@click.option("--port", type=int, default=None, help="Gateway port [default: 8000].")
@click.option("--api-key", default=None, help="Require `Authorization: Bearer KEY` on /v1/*.")
@click.option("--keys", default=None, type=click.Path(file_okay=False), help="CURVE keys folder.")
@click.option(
    "--policy",
    default=None,
    help="The router's policy (tandem router --help) [default: lookahead].",
)
@click.option("--run-dir", default=None, help="Folder for the logs [default: a new one].")
@click.option("--set", "sets", multiple=True, callback=_sets, metavar="SECTION.KEY=VALUE",
              help="Any flag of a process, e.g. router.spin_us=0 (repeatable).")  # fmt: skip
@_worker_knobs
def serve(model: str | None, config_file: str | None, print_config: bool, dry_run: bool,
          devices: str | None, host: str | None, port: int | None, api_key: str | None,
          keys: str | None, policy: str | None, run_dir: str | None,
          sets: dict[str, dict[str, Any]], **knobs: Any) -> None:  # fmt: skip
    """Serve MODEL (a GGUF file, an MLX folder, a Hugging Face name such as
    ORG/NAME-GGUF:Q4_K_M; default: the embedded SmolLM2-135M) on every device of this
    machine behind one OpenAI-compatible endpoint. Flags override --config."""
    from tandem.launcher import config as conf

    try:
        cfg = conf.load(config_file) if config_file else conf.ServeConfig()
        flags: dict[str, dict[str, Any]] = {
            "router": {"policy": policy},
            "gateway": {"host": host, "port": port, "api_key": api_key},
            "worker": knobs,
        }
        sections = {s: {k: v for k, v in {**d, **sets.get(s, {})}.items() if v is not None}
                    for s, d in flags.items()}  # fmt: skip
        top = {"model": model, "devices": devices, "keys": keys, "run_dir": run_dir}
        cfg = cfg.with_flags(top, sections)
        _serve(cfg, print_config, dry_run)
    except (ValueError, FileNotFoundError) as exc:
        raise click.ClickException(str(exc)) from None


def _serve(cfg: Any, print_config: bool, dry_run: bool) -> None:
    from tandem.common.model_files import ModelNotFound, resolve_model
    from tandem.launcher import config as conf
    from tandem.launcher.devices import devices, hints, pick, probe
    from tandem.launcher.plan import effective, make_plan

    if cfg.keys:  # a bad keys folder is refused before any process starts
        from tandem.common.auth import keys_dir

        keys_dir(cfg.keys)
    path: Path | None = None
    if not print_config:
        try:
            # A dry run never downloads: it says what it would serve.
            path = resolve_model(cfg.model, download=not dry_run)
        except ModelNotFound:
            if not dry_run:
                raise
    machine = probe()
    for hint in hints(machine):
        click.echo(f"note: {hint}", err=True)
    found = pick(devices(machine), cfg.devices)
    if path is not None and path.is_dir():  # an MLX folder: llama.cpp reads GGUF only
        found = [d for d in found if d.backend == "mlx"]
        if not found and not cfg.workers:
            why = "install mlx (the mlx-cpu, mlx-metal or mlx-cuda extra) or serve a GGUF"
            raise ValueError(f"{path} is an MLX model folder and no device here runs MLX; {why}")
    eff = effective(cfg, found)
    if print_config:
        make_plan(eff, COMMANDS)  # refuse what the processes would refuse
        click.echo(conf.dumps(eff), nl=False)
        return
    plan = make_plan(eff, COMMANDS, str(path) if cfg.model and path else cfg.model, progress=True)
    if dry_run:
        click.echo(plan.describe())
        return
    folder = _run_dir(cfg.run_dir)
    (folder / "tandem.toml").write_text(conf.dumps(eff))
    (folder / "plan.txt").write_text(plan.describe() + "\n")
    from tandem.launcher.screen import Screen
    from tandem.launcher.supervisor import Supervisor

    name = path.name if path else "SmolLM2-135M"
    sys.exit(Supervisor(plan, folder, Screen(), name).run(cfg.keys))


def _run_dir(given: str | None) -> Path:
    from tandem.common.model_files import cache_root

    if given:
        folder = Path(given).expanduser()
    else:
        runs = cache_root() / "runs"
        for old in sorted(runs.glob("*"))[: -RUNS_KEPT + 1 or None]:
            _remove(old)
        folder = runs / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _remove(folder: Path) -> None:
    import shutil

    shutil.rmtree(folder, ignore_errors=True)
