"""What ``tandem join`` runs once admitted: one worker per device of this machine
against the router elsewhere, supervised as ``tandem serve`` supervises its own
(launcher/supervisor.py: restarted with backoff, stopped with nothing left over).

This host holds a worker key only, which the router's client socket refuses, so a
worker counts as up when its own progress line says the router welcomed it, not by
asking the router's status as serve does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from tandem.launcher.config import ServeConfig
from tandem.launcher.devices import Device
from tandem.launcher.plan import Plan, auto_workers, worker_plan
from tandem.launcher.probes import Probes
from tandem.launcher.supervisor import Supervisor


def join_plan(found: list[Device], node: str, worker_addr: str, keys: Path, model: str | None,
              knobs: dict[str, Any], cmd: click.Command) -> Plan:  # fmt: skip
    """A worker per device found, named ``NODE-cpu0``, ``NODE-gpu0``, ...: ids unique
    across the hosts that join one router, as long as their node names are."""
    gpus = sum(d.gpu for d in found)
    threads = max(1, next((d.cores for d in found if not d.gpu), 1) - 1 - gpus)
    entries = []
    for w in auto_workers(found):
        entry = {**w, "worker_id": f"{node}-{w['worker_id']}", "node": node}
        if w["device"] == "cpu" and w["backend"] == "llama.cpp":
            entry.setdefault("threads", threads)  # no router or gateway shares this host
        entries.append({k: v for k, v in entry.items() if k not in knobs or k == "worker_id"})
    cfg = ServeConfig(model=model, keys=str(keys), worker=knobs, workers=tuple(entries))
    return worker_plan(cfg, cmd, worker_addr, model)


class JoinSupervisor(Supervisor):
    """Supervisor of a worker-only plan: up is the worker's own "registered" line."""

    def __init__(self, plan: Plan, run_dir: Path, screen: Any, model: str, node: str) -> None:
        super().__init__(plan, run_dir, screen, model)
        self.node = node

    def _drain_events(self) -> None:
        while not self.events.empty():
            name, ev = self.events.get_nowait()
            self.screen.event(name, ev)
            child = self._child(name)
            if ev.get("event") == "registered" and child is not None and not child.up:
                child.up = child.ever_up = True
                where = f"registered with the router at {self.plan.worker_addr}"
                self.screen.line("up", name, f"{where} (node {self.node})")

    def _bind_problem(self, keys: str | None) -> tuple[str, str] | None:
        """Workers bind nothing: the router's address is the other host's."""
        return None

    def _observe(self, probes: Probes) -> None:
        """Nothing to ask: the workers' progress lines say when they are up."""

    def _observe_remote(self, probes: Probes) -> None:
        """No workers are expected from elsewhere."""

    def _maybe_ready(self, probes: Probes) -> None:
        running = [c for c in self.children if not c.given_up]
        if self.ready_shown or not running or not all(c.up for c in running):
            return
        self.ready_shown = True
        names = ", ".join(c.name for c in running)
        self.screen.console.print(
            f"joined: {names} serve {self.model} for the router at {self.plan.worker_addr} "
            f"(node {self.node}); logs in {self.run_dir}; Ctrl-C stops them.",
            style="bold green", markup=False,
        )  # fmt: skip
