"""``tandem serve [MODEL]``: the router, one worker per device and the gateway, from
one command; the machinery is in launcher/ (devices, plan, supervisor)."""

from __future__ import annotations

import contextlib
import os
import sys
import time
import tomllib
from dataclasses import replace
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
                "warmup", "weights")  # fmt: skip
RUNS_KEPT = 20  # run folders (logs) kept under the cache root


# What serve picks per device when a knob is not given (launcher/plan.py).
SERVE_DEFAULTS = {
    "threads": "the cores less one each for the router, the gateway and every GPU "
    "worker's host thread, at least 1",
    "max_active": f"{CPU_MAX_ACTIVE} on a CPU, {GPU_MAX_ACTIVE} on a GPU",
}


def worker_knobs(defaults: dict[str, str]) -> Any:
    """The WORKER_KNOBS as options of a command that starts workers (serve, join),
    each saying what ``defaults`` picks when it is not given."""

    def add(f: Any) -> Any:
        options = option_keys(worker_command)
        for name in reversed(WORKER_KNOBS):
            opt = options[name]
            text = f"Every worker: {opt.help or name}"
            if name in defaults:
                text += f" [default: {defaults[name]}]"
            f = click.option(*opt.opts, type=opt.type, default=None, help=text)(f)
        return f

    return add


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
@click.option(
    "--engine",
    type=click.Choice(["auto", "llama.cpp", "mlx"]),
    default=None,
    help="Each GPU's engine: auto = the one its stored profiles measured fastest there "
    "(before any is measured: llama.cpp on CUDA, MLX on Apple silicon) [default: auto].",
)
@click.option("--host", default=None, help="Gateway address [default: 127.0.0.1].")
@click.option("--port", type=int, default=None, help="Gateway port [default: 8000].")
@click.option("--api-key", default=None, help="Require `Authorization: Bearer KEY` on /v1/*.")
@click.option("--keys", default=None, type=click.Path(file_okay=False), help="CURVE keys folder.")
@click.option(
    "--listen",
    default=None,
    metavar="HOST",
    help="Let other hosts attach workers (tandem join): the router's worker socket and the "
    "join service listen on HOST (0.0.0.0: every interface); keys are made when none are "
    "given [default: this host only].",
)
@click.option(
    "--join-addr",
    default=None,
    help="The join service's address [default: the worker socket's host, port 5557].",
)
@click.option(
    "--policy",
    default=None,
    help="The router's policy (tandem router --help) [default: lookahead].",
)
@click.option("--run-dir", default=None, help="Folder for the logs [default: a new one].")
@click.option("--ray", "ray_address", default=None, is_flag=False, flag_value="auto",
              metavar="[ADDRESS]", help="Serve on the Ray cluster at ADDRESS (as ray.init "
              "takes it; auto: the one this host belongs to): a worker per device on every "
              "node, the router on the head or a node offering `tandem-router` "
              "(docs/DEPLOY.md).")  # fmt: skip
@click.option("--set", "sets", multiple=True, callback=_sets, metavar="SECTION.KEY=VALUE",
              help="Any flag of a process, e.g. router.spin_us=0 (repeatable).")  # fmt: skip
@worker_knobs(SERVE_DEFAULTS)
def serve(model: str | None, config_file: str | None, print_config: bool, dry_run: bool,
          devices: str | None, engine: str | None, host: str | None, port: int | None,
          api_key: str | None, keys: str | None, listen: str | None, join_addr: str | None,
          policy: str | None, run_dir: str | None, ray_address: str | None,
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
        top = {"model": model, "devices": devices, "engine": engine, "keys": keys,
               "run_dir": run_dir, "listen": listen, "join_addr": join_addr}  # fmt: skip
        cfg = cfg.with_flags(top, sections)
        if ray_address is not None:
            _serve_ray(cfg, ray_address, print_config or dry_run)
        _serve(cfg, print_config, dry_run)
    except (ValueError, FileNotFoundError) as exc:
        raise click.ClickException(str(exc)) from None


def _serve(cfg: Any, print_config: bool, dry_run: bool) -> None:
    from tandem.common.model_files import ModelNotFound, resolve_model
    from tandem.launcher import config as conf
    from tandem.launcher.devices import devices, hints, pick, probe
    from tandem.launcher.joinservice import private_keys, start_service
    from tandem.launcher.plan import effective, join_address, make_plan

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
    found, choices = _engines(cfg, found, path)
    eff = effective(cfg, found)
    if print_config:
        plan = make_plan(eff, COMMANDS)  # refuse what the processes would refuse
        click.echo(conf.dumps(_in_effect(eff, plan)), nl=False)
        return
    plan = make_plan(eff, COMMANDS, str(path) if cfg.model and path else cfg.model, progress=True)
    shown = "".join(c.line() + "\n" for c in choices) + plan.describe()
    if dry_run:
        click.echo(shown)
        return
    from tandem.launcher.engines import record

    folder = _run_dir(cfg.run_dir)
    join_at = join_address(eff, plan.worker_addr)
    if join_at and not eff.keys:  # other hosts may reach it: never without keys
        eff = replace(eff, keys=str(private_keys(folder / "keys")))
        plan = make_plan(eff, COMMANDS, str(path) if cfg.model and path else cfg.model, True)
    _write_private(folder / "tandem.toml", conf.dumps(eff))  # it may hold the API key
    (folder / "plan.txt").write_text(shown + "\n")
    record(choices, folder)
    for c in choices:
        click.echo(c.line(), err=True)
    from tandem.launcher.screen import Screen
    from tandem.launcher.supervisor import Supervisor

    service = start_service(join_at, eff, plan.worker_addr, path) if join_at else None
    name = path.name if path else "SmolLM2-135M"
    sys.exit(Supervisor(plan, folder, Screen(), name, service=service).run(eff.keys))


def _engines(cfg: Any, found: list[Any], path: Path | None) -> tuple[list[Any], list[Any]]:
    """Each GPU's engine (launcher/engines.py), by the model's stored profiles."""
    from tandem.common.model_files import DEFAULT_MODEL_FILE
    from tandem.launcher.engines import apply
    from tandem.workers.profiles import read_rates

    forced = None if cfg.engine == "auto" else cfg.engine
    model = path.name if path is not None else Path(cfg.model or DEFAULT_MODEL_FILE).name
    max_active = int(cfg.worker.get("max_active", GPU_MAX_ACTIVE))
    return apply(found, model, max_active, read_rates, forced)


def _serve_ray(cfg: Any, address: str, only_print: bool) -> None:
    """The fleet on a Ray cluster (fleet/driver.py); exits when it ends."""
    if only_print:
        raise ValueError("--print-config and --dry-run describe one machine; drop --ray")
    if cfg.keys:
        raise ValueError("with --ray the fleet makes its own keys and carries them through Ray; "
                         "drop --keys")  # fmt: skip
    from tandem.fleet import RayMissing, need_ray
    from tandem.fleet.plans import check, router_ports

    router_ports(cfg)  # the ports the router takes on its node: refused now, not there
    check(cfg, COMMANDS)  # a flag a process would refuse: refused before any node starts
    try:
        need_ray()
    except RayMissing as exc:
        raise click.ClickException(str(exc)) from None
    from tandem.fleet.driver import FleetError, serve_on_ray
    from tandem.launcher.screen import Screen

    try:
        sys.exit(serve_on_ray(cfg, address, Screen(), COMMANDS))
    except FleetError as exc:
        raise click.ClickException(str(exc)) from None
    except ConnectionError as exc:  # ray.init found no cluster there
        raise click.ClickException(f"no Ray cluster at {address!r}: {exc}") from None


def _in_effect(eff: Any, plan: Any) -> Any:
    """``eff`` with what the plan takes from defaults and the environment written in:
    the model, the router's addresses (TANDEM_CLIENT_ADDR / TANDEM_WORKER_ADDR) and
    policy, the gateway's host and port (TANDEM_GATEWAY_HOST / _PORT)."""
    from dataclasses import replace

    from tandem.common.model_files import default_model_path
    from tandem.launcher.plan import option_keys

    model = eff.model
    if model is None:
        with contextlib.suppress(FileNotFoundError):  # not installed: leave it unset
            model = str(default_model_path())
    policy = option_keys(router_command)["policy"].default
    router = {"policy": policy, **eff.router}
    router |= {"client_addr": plan.client_addr, "worker_addr": plan.worker_addr}
    host, _, port = plan.gateway_bind.rpartition(":")
    gateway = {**eff.gateway, "host": host, "port": int(port)}
    return replace(eff, model=model, router=router, gateway=gateway)


def _write_private(path: Path, text: str) -> None:
    """Write ``path`` readable by its owner alone (0600), even where it was not."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(fd, 0o600)  # an existing file keeps its mode through open: set it
        f.write(text)


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
