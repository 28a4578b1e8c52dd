"""What ``tandem serve`` starts: a pure function from the devices found and the
configuration to the processes, each with its ``tandem`` command line.

Every flag of ``tandem router``, ``tandem gateway`` and ``tandem worker`` can be
set (config keys are the flags' long names); the commands' own parsers check the
values, so a plan that prints is a plan whose processes accept their flags.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import click

from tandem.common.model_files import HubName, model_display_name
from tandem.common.settings import DEFAULT_JOIN_PORT, addresses, env_str
from tandem.launcher.config import WORKER_EXTRA, ServeConfig
from tandem.launcher.devices import Device

CPU_MAX_ACTIVE, GPU_MAX_ACTIVE = 4, 16  # a GPU's step costs about the same from 1 to 16
# Keys serve sets itself, and where to say them instead.
RESERVED = {
    "router": {"keys": "the top-level keys"},
    "gateway": {"router": "[router] client_addr"},
    "worker": {"router": "[router] worker_addr", "keys": "the top-level keys"},
}


@dataclass(frozen=True)
class Proc:
    """One process to start: ``tandem *argv`` with ``env`` added to the environment."""

    name: str
    role: str  # router | gateway | worker
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Plan:
    procs: tuple[Proc, ...]
    remote: tuple[str, ...]  # worker ids expected to attach from other hosts
    client_addr: str
    worker_addr: str
    url: str  # the gateway's base URL
    api_key: str | None
    gateway_bind: str = ""  # host:port the gateway listens on
    model_name: str = ""  # the served model's display name (an id /v1/models lists)

    def describe(self) -> str:
        """The plan as text: one line per process, secrets masked."""
        lines = []
        for p in self.procs:
            env = " ".join(f"{k}={'***' if 'KEY' in k else v}" for k, v in p.env)
            lines.append(f"{p.name:<8} {env + ' ' if env else ''}tandem {shlex.join(p.argv)}")
        lines += [f"{'remote':<8} {w}: expected at {self.worker_addr}" for w in self.remote]
        lines.append(f"{'endpoint':<8} {self.url}/v1")
        return "\n".join(lines)


def option_keys(cmd: click.Command) -> dict[str, click.Option]:
    """A command's options by config key: the long flag name, ``_`` for ``-``."""
    out = {}
    for p in cmd.params:
        if isinstance(p, click.Option):
            out[max(p.opts, key=len).lstrip("-").replace("-", "_")] = p
    return out


def effective(cfg: ServeConfig, found: list[Device]) -> ServeConfig:
    """``cfg`` with its workers listed: one per device found unless the config lists
    them, a CPU worker's threads the cores the other processes leave it."""
    # [worker] (and worker flags) override the per-device defaults of found workers.
    auto = [{k: v for k, v in w.items() if k not in cfg.worker} for w in auto_workers(found)]
    workers = list(cfg.workers) or auto
    cores = next((d.cores for d in found if not d.gpu), 1)
    gpus = sum(1 for w in workers if _local(w) and str(w.get("device", "")).startswith("gpu"))
    # One core each for the router, the gateway and every GPU worker's host thread:
    # a llama.cpp thread sharing a core stalls its siblings (2 threads on this 2-core
    # machine: 1.3-1.7x faster when it was idle, 0.14-0.17x under load;
    # docs/results/startup.md).
    threads = max(1, cores - 2 - gpus)
    if "threads" not in cfg.worker:
        workers = [_with_threads(w, threads) for w in workers]
    return replace(cfg, workers=tuple(workers))


def auto_workers(found: list[Device]) -> list[dict[str, Any]]:
    """One worker per device, each keeping what it measures at its first start as its
    profile: its next start registers at once, and serve chooses each GPU's engine by
    those profiles (launcher/engines.py)."""
    out: list[dict[str, Any]] = []
    for i, d in enumerate(d for d in found if d.gpu):
        # MLX picks its GPU by --device gpu; llama.cpp offloads to it when labelled gpu-*.
        device = "gpu" if d.backend == "mlx" else f"gpu-{d.kind}"
        w: dict[str, Any] = {"worker_id": f"gpu{i}", "backend": d.backend, "device": device}
        w |= {"max_active": GPU_MAX_ACTIVE, "keep_profile": True}
        out.append({**w, **({"env": d.env} if d.env else {})})
    cpu = [d for d in found if not d.gpu]
    if cpu:
        w = {"worker_id": "cpu0", "backend": cpu[0].backend, "device": "cpu"}
        out.insert(0, {**w, "max_active": CPU_MAX_ACTIVE, "keep_profile": True})
    return out


def _with_threads(w: dict[str, Any], threads: int) -> dict[str, Any]:
    cpu = w.get("backend", "llama.cpp") == "llama.cpp" and w.get("device", "cpu") in ("cpu", "auto")
    return {**w, "threads": threads} if _local(w) and cpu and "threads" not in w else w


def _local(w: dict[str, Any]) -> bool:
    return not w.get("remote", False)


def make_plan(
    cfg: ServeConfig,
    cmds: Mapping[str, click.Command],
    model_path: str | None = None,
    progress: bool = False,
) -> Plan:
    """The processes for an ``effective`` config; ValueError names a bad key or value.
    ``cmds``: the ``router``, ``worker`` and ``gateway`` click commands, whose options
    are the config's keys and whose parsers check the values (passed in: the launcher
    sits below the CLI); ``model_path``: the resolved model for workers that name none;
    ``progress``: ask workers for JSON progress lines (when their command has the flag)."""
    _reserved("router", "[router]", cfg.router)
    _reserved("gateway", "[gateway]", cfg.gateway)
    _reserved("worker", "[worker]", cfg.worker)
    defaults = addresses()  # TANDEM_CLIENT_ADDR / TANDEM_WORKER_ADDR, as the other commands
    client = str(cfg.router.get("client_addr", defaults.client))
    worker_addr = str(cfg.router.get("worker_addr", defaults.worker))
    if cfg.listen:  # other hosts attach: the worker socket listens where they reach it
        worker_addr = with_host(worker_addr, cfg.listen)
    keys = {"keys": cfg.keys} if cfg.keys else {}
    router_values = {**cfg.router, "client_addr": client, "worker_addr": worker_addr, **keys}
    router_argv = _argv(cmds["router"], "router", "[router]", router_values)
    gw = dict(cfg.gateway)
    api_key = gw.pop("api_key", None)
    host = str(gw.pop("host", env_str("GATEWAY_HOST", "127.0.0.1")))
    port_text = str(gw.pop("port", env_str("GATEWAY_PORT", "8000")))
    if not port_text.isdigit():
        raise ValueError(f"[gateway] port must be a port number, not {port_text!r}")
    port = int(port_text)
    gw["model_alias"] = _aliases(cfg, gw.get("model_alias", []))
    gw_values = {"router": client, "host": host, "port": port, **gw}
    procs = [Proc("router", "router", router_argv)]
    procs += _workers(cfg, cmds["worker"], worker_addr, model_path, progress)
    # Secrets by environment, not argv (argv is visible to every user of the machine);
    # the gateway has no --keys flag: its router connection reads TANDEM_KEYS.
    gw_env: tuple[tuple[str, str], ...] = (("TANDEM_API_KEY", str(api_key)),) if api_key else ()
    gw_env += (("TANDEM_KEYS", cfg.keys),) if cfg.keys else ()
    gw_argv = _argv(cmds["gateway"], "gateway", "[gateway]", gw_values)
    procs.append(Proc("gateway", "gateway", gw_argv, gw_env))
    remote = tuple(str(w.get("worker_id")) for w in cfg.workers if not _local(w))
    url_host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    url = f"http://{url_host}:{port}"
    name = model_display_name(_served(cfg))
    return Plan(tuple(procs), remote, client, worker_addr, url, api_key, f"{host}:{port}", name)


def with_host(address: str, host: str) -> str:
    """``address`` (tcp://HOST:PORT) on another host; ValueError for another scheme."""
    if not address.startswith("tcp://"):
        raise ValueError(f"--listen needs a tcp:// worker address, not {address!r}")
    port = address.rsplit(":", 1)[1]
    host = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"tcp://{host}:{port}"


def join_address(cfg: ServeConfig, worker_addr: str) -> str | None:
    """Where the join service listens: ``join_addr``, else the worker socket's host at
    port DEFAULT_JOIN_PORT; None when serve runs none (no --listen, no join_addr, no
    remote worker: no other host is meant to attach)."""
    remote = any(not _local(w) for w in cfg.workers)
    if not (cfg.join_addr or cfg.listen or remote):
        return None
    if cfg.join_addr:
        return cfg.join_addr
    if not worker_addr.startswith("tcp://"):
        raise ValueError("other hosts need a tcp:// worker address ([router] worker_addr)")
    return with_host(f"tcp://x:{DEFAULT_JOIN_PORT}", worker_addr[6:].rsplit(":", 1)[0])


def worker_plan(
    cfg: ServeConfig, cmd: click.Command, worker_addr: str, model_path: str | None = None
) -> Plan:
    """Only ``cfg``'s workers, against a router that runs elsewhere (``tandem join``):
    no router, no gateway, nothing expected from other hosts."""
    _reserved("worker", "[worker]", cfg.worker)
    procs = _workers(cfg, cmd, worker_addr, model_path, progress=True)
    return Plan(tuple(procs), (), "", worker_addr, "", None)


def _served(cfg: ServeConfig) -> str | None:
    """The model the plan serves, as named (None: the embedded default)."""
    return cfg.model or next(
        (w["model"] for w in cfg.workers if _local(w) and w.get("model")), None
    )


def _aliases(cfg: ServeConfig, given: str | list[str]) -> list[str]:
    """The gateway's model names: those given, the model's display name (so /v1/models
    lists it while workers start, and clients may ask for it by it) and the hub name
    it was served by."""
    model = _served(cfg)
    names = [given] if isinstance(given, str) else list(given)
    names.append(model_display_name(model))
    if model and HubName.parse(model):  # clients may ask for it by its hub name
        names.append(model)
    return list(dict.fromkeys(names))  # in order, once each


def _workers(
    cfg: ServeConfig, cmd: click.Command, addr: str, model: str | None, progress: bool
) -> list[Proc]:
    for key in ("worker_id", *WORKER_EXTRA):
        if key in cfg.worker:
            raise ValueError(f"[worker] {key}: set it on each [[workers]] entry")
    procs, seen = [], set()
    for n, w in enumerate(cfg.workers):
        wid = w.get("worker_id")
        where = f"[[workers]] #{n + 1}" + (f" ({wid})" if wid else "")
        if not wid:
            raise ValueError(f"{where}: worker_id is required")
        if wid in seen or wid in ("router", "gateway"):
            raise ValueError(f"{where}: worker_id {wid!r} is taken")
        seen.add(wid)
        if not _local(w):
            if set(w) - {"worker_id", "remote"}:
                raise ValueError(f"{where}: a remote worker takes only worker_id and remote")
            continue
        env = w.get("env", {})
        if not isinstance(env, dict):
            raise ValueError(f"{where}: env must be a table of strings")
        own = {k: v for k, v in w.items() if k not in WORKER_EXTRA}
        _reserved("worker", where, own)
        values = {**cfg.worker, **own}
        if model and "model" not in values:
            values["model"] = model
        values["router"] = addr
        if cfg.keys:
            values["keys"] = cfg.keys
        if progress and "progress_json" in option_keys(cmd):
            values["progress_json"] = True
        argv = _argv(cmd, "worker", where, values)
        procs.append(Proc(str(wid), "worker", argv, tuple((k, str(v)) for k, v in env.items())))
    return procs


def _reserved(name: str, where: str, values: dict[str, Any]) -> None:
    for key in values:
        if key in RESERVED[name]:
            raise ValueError(f"{where}: {key} is set by serve; use {RESERVED[name][key]}")


def _argv(cmd: click.Command, name: str, where: str, values: dict[str, Any]) -> tuple[str, ...]:
    """``name`` and the flags that set ``values``, checked by the command's parser."""
    options = option_keys(cmd)
    argv = [name]
    for key, value in values.items():
        if value is None:
            continue
        if key not in options:
            raise ValueError(f"{where}: unknown key {key!r} (`tandem {name}` has no --{key})")
        argv += _flag(options[key], key, value, where)
    try:
        cmd.make_context(name, argv[1:])
    except click.UsageError as exc:
        raise ValueError(f"{where}: {exc.format_message()}") from None
    return tuple(argv)


def _flag(opt: click.Option, key: str, value: Any, where: str) -> list[str]:
    long = max(opt.opts, key=len)
    if opt.is_flag:
        if not isinstance(value, bool):
            raise ValueError(f"{where}: {key} must be true or false, not {value!r}")
        off = opt.secondary_opts[0] if opt.secondary_opts else None
        return [long] if value else [off] if off else []
    if opt.multiple:
        items = value if isinstance(value, list | tuple) else [value]
        return [x for v in items for x in (long, _text(v))]
    if isinstance(value, list | tuple):  # comma lists: --decode-tok-s, --cpus
        return [long, ",".join(_text(v) for v in value)]
    return [long, _text(value)]


def _text(v: Any) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)
