"""What ``tandem serve`` prints: one line per component as it comes up, a progress
bar per worker while it loads and measures itself, and the ready screen.

Lines go to stdout (a script waits for ``ready:``); the bars are drawn only on a
terminal, elsewhere each stage is one line.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn

from tandem.common.model_files import model_display_name
from tandem.launcher.plan import Plan

MARKS = {"up": ("✓", "green"), "down": ("✗", "red"), "note": ("•", "yellow"), "info": ("·", "")}


class Screen:
    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(highlight=False, soft_wrap=True)
        self.live = self.console.is_terminal
        self.bars = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            console=self.console,
            transient=True,
            disable=not self.live,
        )
        self.tasks: dict[str, Any] = {}
        self.stage: dict[str, str] = {}
        self.bars.start()

    def line(self, kind: str, name: str, text: str) -> None:
        mark, style = MARKS[kind]
        self.console.print(f"{mark} {name:<8} {text}", style=style or None, markup=False)

    def event(self, name: str, ev: dict[str, Any]) -> None:
        """A worker's progress line (``tandem worker --progress-json``)."""
        kind = ev.get("event")
        if kind == "loading":
            self._stage(name, f"{name} loading {ev.get('model', 'the model')}", None, 0)
        elif kind == "measuring":
            total, done = int(ev.get("total") or 0), int(ev.get("done") or 0)
            self._stage(name, f"{name} measuring its step times", total or None, done)
        elif kind == "error":
            self.line("down", name, str(ev.get("message", "error")))
        elif kind == "registered":
            self.done(name)

    def starting(self, name: str, log: Path) -> None:
        """A worker was started: a spinner until its progress lines or registration."""
        if self.live:
            self._stage(name, f"{name} starting: loading the model, measuring the device", None, 0)
        else:
            self.line("info", name, f"starting (log: {log})")

    def _stage(self, name: str, text: str, total: int | None, done: int) -> None:
        if name not in self.tasks:
            self.tasks[name] = self.bars.add_task(text, total=total)
        self.bars.update(self.tasks[name], description=text, total=total, completed=done)
        if not self.live and self.stage.get(name) != text:  # one line per stage
            self.line("info", name, text.removeprefix(name + " "))
        self.stage[name] = text

    def done(self, name: str) -> None:
        task = self.tasks.pop(name, None)
        if task is not None:
            self.bars.remove_task(task)
        self.stage.pop(name, None)

    def failure(self, name: str, reason: str, log: Path | None) -> None:
        self.line("down", name, reason)
        tail = log_tail(log) if log else ""
        if tail:
            self.console.print(f"--- last lines of {log}:\n{tail}", style="dim", markup=False)

    def ready(
        self,
        plan: Plan,
        model: str,
        workers: list[str],
        run_dir: Path,
        others: Sequence[tuple[str, str]] = (),
    ) -> None:
        self.bars.stop()
        out = self.console
        out.print(f"ready: {plan.url}/v1", style="bold green", markup=False)
        shown = plan.model_name or model_display_name(model)  # an id /v1/models lists
        rows = [
            ("model", model if shown == model else f"{shown} ({model})"),
            ("workers", ", ".join(workers)),
            ("OpenAI API", f"{plan.url}/v1"),
            ("router", f"{plan.client_addr} (tandem generate / status / top{_keys(plan)})"),
            ("logs", str(run_dir)),
        ]
        rows += list(others)  # other hosts: the tandem join command (launcher/fleet.py)
        for key, value in rows:
            out.print(f"  {key:<11} {value}", markup=False)
        out.print("  try:", markup=False)
        out.print("    " + curl(plan, shown), markup=False)
        out.print("Ctrl-C stops every process.", style="dim", markup=False)
        self.bars.start()

    def close(self) -> None:
        self.bars.stop()


def _keys(plan: Plan) -> str:
    """`` --keys DIR`` when the router runs with keys (its clients need them too)."""
    argv = next((p.argv for p in plan.procs if p.role == "router"), ())
    return f" --keys {argv[argv.index('--keys') + 1]}" if "--keys" in argv else ""


def curl(plan: Plan, model: str) -> str:
    body = {"model": model, "messages": [{"role": "user", "content": "Say hello."}]}
    # -s: no progress meter over the answer (it is all a paste of it would show).
    url = f"{plan.url}/v1/chat/completions"
    args = ["curl", "-s", url, "-H", "Content-Type: application/json"]
    if plan.api_key:
        args += ["-H", f"Authorization: Bearer {plan.api_key}"]
    return shlex.join([*args, "-d", json.dumps(body)])


def log_tail(path: Path, lines: int = 12) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])
