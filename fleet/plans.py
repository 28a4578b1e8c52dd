"""What each fleet actor starts, from the one ServeConfig ``tandem serve --ray``
was given: the router and gateway on the router's node, one worker per device on
every node. launcher/plan.py builds the command lines (the same checks and flags
as ``tandem serve``); this module only says where each process points."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import click

from tandem.launcher.config import ServeConfig
from tandem.launcher.plan import Plan, Proc

DEFAULT_PORTS = (5555, 5556)  # the router's client and worker ports, as tandem serve's


@dataclass(frozen=True)
class RouterAddress:
    """Where the fleet's router is now; ``incarnation`` changes with every start of
    its actor (a restart on the same node may keep the addresses)."""

    client: str
    worker: str
    gateway_url: str
    node_id: str
    incarnation: str


def short(node_id: str) -> str:
    """A node's id as worker ids and the screen show it."""
    return node_id[:8]


def router_ports(cfg: ServeConfig) -> tuple[int, int]:
    """The ports the router binds on its node: those of ``[router] client_addr`` and
    ``worker_addr`` when given (0: a free one at each start), else 5555 and 5556."""
    ports = []
    for key, default in zip(("client_addr", "worker_addr"), DEFAULT_PORTS, strict=True):
        given = cfg.router.get(key)
        if given is None:
            ports.append(default)
            continue
        port = str(given).rpartition(":")[2]
        if not port.isdigit():
            raise ValueError(f"[router] {key} {given!r}: want tcp://HOST:PORT (the port is used)")
        ports.append(int(port))
    return ports[0], ports[1]


Commands = Mapping[str, click.Command]  # `tandem router`, `worker`, `gateway` (launcher/plan.py)


def host_plan(
    cfg: ServeConfig,
    node_id: str,
    ip: str,
    ports: tuple[int, int],
    keys: Path,
    cmds: Commands,
) -> Plan:
    """The router (bound to this node's address) and the gateway in front of it."""
    router = {**cfg.router, "client_addr": f"tcp://{ip}:{ports[0]}",
              "worker_addr": f"tcp://{ip}:{ports[1]}"}  # fmt: skip
    plan = _plan(replace(cfg, router=router, keys=str(keys)), [], cmds)
    node_env = (("TANDEM_NODE", node_id),)
    return replace(plan, procs=tuple(replace(p, env=p.env + node_env) for p in plan.procs))


def worker_plan(
    cfg: ServeConfig,
    node_id: str,
    gpu_ids: list[str],
    worker_addr: str,
    router_file: Path,
    keys: Path,
    cmds: Commands,
) -> list[Proc]:
    """This node's workers: its CPU and each GPU Ray gave this node's agent, with
    ids unique in the fleet and TANDEM_NODE naming the node."""
    from tandem.launcher.devices import devices, pick, probe

    found = [d for d in pick(devices(probe()), cfg.devices) if d.kind in ("cpu", "cuda")]
    cpus = [d for d in found if not d.gpu]
    # One worker per GPU Ray gave this agent, each seeing only its own; none where no
    # engine here can drive a GPU (the node's log says so).
    engine = next((d for d in found if d.gpu), None)
    gpus = [replace(engine, index=i, env={"CUDA_VISIBLE_DEVICES": g})
            for i, g in enumerate(gpu_ids)] if engine else []  # fmt: skip
    # Each worker follows the router's address in ``router_file`` (workers/follow.py):
    # when Ray moves the router, the agent rewrites the file, no worker restarts.
    router = {**cfg.router, "worker_addr": worker_addr}
    worker = {**cfg.worker, "router_file": str(router_file)}
    cfg = replace(cfg, router=router, worker=worker, keys=str(keys))
    plan = _plan(cfg, [*cpus, *gpus], cmds, short(node_id))
    node_env = (("TANDEM_NODE", node_id),)
    return [replace(p, env=p.env + node_env) for p in plan.procs if p.role == "worker"]


def check(cfg: ServeConfig, cmds: Commands) -> None:
    """Refuse a config whose processes would refuse their flags (ValueError naming the
    key), before anything starts: the plans of a node with a CPU, as every node has.
    Nothing is resolved or downloaded here; each node resolves the model itself."""
    from tandem.launcher.devices import Device
    from tandem.launcher.plan import effective, make_plan

    router = {**cfg.router, "client_addr": "tcp://127.0.0.1:1", "worker_addr": "tcp://127.0.0.1:2"}
    cfg = replace(cfg, router=router, worker={**cfg.worker, "router_file": "router"})
    make_plan(effective(cfg, [Device("cpu", "llama.cpp", cores=2)]), cmds, cfg.model)


def _plan(cfg: ServeConfig, found: list[Any], cmds: Commands, prefix: str = "") -> Plan:
    from tandem.common.model_files import resolve_model
    from tandem.launcher.plan import effective, make_plan

    eff = effective(cfg, found)
    if prefix:
        workers = tuple({**w, "worker_id": f"{prefix}-{w['worker_id']}"} for w in eff.workers)
        eff = replace(eff, workers=workers)
    path = resolve_model(cfg.model) if cfg.model and found else None
    return make_plan(eff, cmds, str(path) if path else cfg.model)
