"""Run a plan's processes: start them, say when each is up, restart a crashed one
with backoff, and stop them all on SIGINT/SIGTERM with nothing left behind.

Each child runs in its own process group, so a Ctrl-C at the terminal reaches only
this supervisor, which stops workers first (their Goodbyes reach the router), then
the gateway and the router; a group still alive after the grace is SIGKILLed.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import psutil

from tandem.launcher.fleet import Fleet
from tandem.launcher.joinservice import JoinService
from tandem.launcher.plan import Plan, Proc
from tandem.launcher.probes import Probes, port_problem
from tandem.launcher.screen import Screen

# Loaded before any fork: the child only calls it between fork and exec.
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None
_PR_SET_PDEATHSIG = 1

BACKOFF_MAX_S = 30.0
STABLE_S = 60.0  # a process up this long has its backoff reset when it dies
START_TRIES = 3  # a worker that dies this often before registering is given up


class StartFailed(Exception):
    def __init__(self, name: str, reason: str) -> None:
        super().__init__(reason)
        self.name = name


@dataclass
class Child:
    proc: Proc
    log: Path
    popen: subprocess.Popen[bytes] | None = None
    started_s: float = 0.0
    up: bool = False  # router answers / gateway answers / worker registered
    ever_up: bool = False
    deaths: int = 0  # consecutive quick exits
    restart_at: float | None = None
    given_up: bool = False
    readers: list[threading.Thread] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.proc.name

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None


class Supervisor:
    def __init__(
        self,
        plan: Plan,
        run_dir: Path,
        screen: Screen,
        model: str,
        grace_s: float = 5.0,
        prefix: tuple[str, ...] = (sys.executable, "-m", "tandem"),  # a plan's argv follows
        service: JoinService | None = None,
    ) -> None:
        self.plan, self.run_dir, self.screen, self.model = plan, run_dir, screen, model
        self.grace_s, self.prefix = grace_s, prefix
        self.children = [Child(p, run_dir / f"{p.name}.log") for p in plan.procs]
        self.events: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
        self.stop = threading.Event()
        self.hurry = False  # a second signal: SIGKILL at once
        self.ready_shown = False
        local = {c.name for c in self.children}
        self.fleet = Fleet(screen, local, set(plan.remote), service)

    # ---------------------------------------------------------------- run
    def run(self, keys: str | None = None) -> int:
        """Serve until a signal (exit 0) or until the router or gateway cannot start,
        or no worker can (exit 1, with the reason)."""
        problem = self._bind_problem(keys)
        if problem:
            self.fleet.close()
            self.screen.failure(*problem, None)
            return 1
        signals = (signal.SIGINT, signal.SIGTERM)
        before = {sig: signal.signal(sig, self._on_signal) for sig in signals}
        probes = Probes(self.plan, keys)
        try:
            for child in self.children:
                self._start(child)
            while not self.stop.is_set():
                self._drain_events()
                self._reap()
                self._observe(probes)
                self._observe_remote(probes)
                self._restart_due()
                self._maybe_ready(probes)
                self.stop.wait(0.2)
            return 0
        except StartFailed as exc:
            failed = self._child(exc.name)
            self.screen.failure(exc.name, str(exc), failed.log if failed else None)
            return 1
        finally:
            probes.close()
            self.fleet.close()
            self.screen.close()
            left = self.stop_all()
            print(f"stopped ({left} process{'es' if left != 1 else ''} had to be killed)")
            for sig, handler in before.items():
                signal.signal(sig, handler)

    def _bind_problem(self, keys: str | None) -> tuple[str, str] | None:
        """An address the plan binds that is taken, before anything starts."""
        return port_problem(self.plan, keys)

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.stop.is_set():  # asked twice: no more grace
            self.hurry = True
            _signal_all(self.children, signal.SIGKILL)
        self.stop.set()

    def _child(self, name: str) -> Child | None:
        return next((c for c in self.children if c.name == name), None)

    # ---------------------------------------------------------- processes
    def _start(self, child: Child) -> subprocess.Popen[bytes]:
        log = open(child.log, "ab")  # noqa: SIM115 - closed by the reader or kept by the child
        log.write(f"--- {time.strftime('%H:%M:%S')} tandem {' '.join(child.proc.argv)}\n".encode())
        log.flush()
        piped = "--progress-json" in child.proc.argv
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **dict(child.proc.env)}
        child.popen = popen = subprocess.Popen(
            [*self.prefix, *child.proc.argv],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if piped else log,
            stderr=log,
            env=env,
            process_group=0,  # its own group: Ctrl-C reaches us, and killpg reaches its children
            preexec_fn=_die_with_parent,
        )
        if not piped:
            log.close()  # the child holds its own copy
        child.started_s, child.up, child.restart_at = time.monotonic(), False, None
        if piped:
            assert popen.stdout is not None
            reader = threading.Thread(
                target=self._read, args=(child.name, popen.stdout, log), daemon=True
            )
            reader.start()
            child.readers.append(reader)
        if child.proc.role == "worker":
            self.screen.starting(child.name, child.log)
        return popen

    def _read(self, name: str, pipe: IO[bytes], log: IO[bytes]) -> None:
        """A worker's stdout: its JSON progress lines become events, the rest is logged."""
        for raw in pipe:
            try:
                ev = json.loads(raw) if raw.startswith(b"{") else None
            except ValueError:
                ev = None
            if isinstance(ev, dict) and "event" in ev:
                self.events.put((name, ev))
            else:
                log.write(raw)
                log.flush()
        log.close()

    def _reap(self) -> None:
        """Notice exits: the router or gateway before it came up is fatal; anything
        else is restarted after a backoff that grows with quick repeated deaths."""
        now = time.monotonic()
        for child in self.children:
            if child.popen is None or child.restart_at is not None or child.given_up:
                continue
            code = child.popen.poll()
            if code is None:
                continue
            why = describe_exit(code)
            _signal_all([child], signal.SIGKILL)  # anything it left in its group goes too
            if child.proc.role != "worker" and not child.ever_up:
                raise StartFailed(child.name, f"could not start ({why})")
            child.deaths = 1 if now - child.started_s > STABLE_S else child.deaths + 1
            if child.proc.role == "worker" and not child.ever_up and child.deaths >= START_TRIES:
                child.given_up = True
                self.screen.failure(child.name, f"{why} {child.deaths} times: given up", child.log)
                self._check_any_worker()
                continue
            delay = min(BACKOFF_MAX_S, 2.0 ** (child.deaths - 1))
            child.restart_at, child.up = now + delay, False
            self.screen.done(child.name)
            # Its last words when it failed by itself; a signal's cause is elsewhere.
            tail = child.log if code > 0 else None
            self.screen.failure(child.name, f"{why}; restarting in {delay:.0f} s", tail)

    def _check_any_worker(self) -> None:
        workers = [c for c in self.children if c.proc.role == "worker"]
        if workers and all(c.given_up for c in workers) and not self.plan.remote:
            raise StartFailed(workers[-1].name, "no worker could start")

    def _restart_due(self) -> None:
        now = time.monotonic()
        for child in self.children:
            if child.restart_at is not None and now >= child.restart_at and not self.stop.is_set():
                pid = self._start(child).pid
                self.screen.line("note", child.name, f"restarted (pid {pid})")

    # ----------------------------------------------------------- readiness
    def _drain_events(self) -> None:
        while True:
            try:
                name, ev = self.events.get_nowait()
            except queue.Empty:
                return
            self.screen.event(name, ev)

    def _observe(self, probes: Probes) -> None:
        """Ask whoever is not up yet whether it is now; say so once per start."""
        for child in self.children:
            if child.up or not child.alive():
                continue
            role = child.proc.role
            if role == "router":
                detail = probes.router()
            elif role == "gateway":
                detail = probes.gateway()
            else:
                detail = probes.worker(child.name, child.started_s)
            if detail is not None:
                child.up = child.ever_up = True
                self.screen.done(child.name)
                self.screen.line("up", child.name, detail)

    def _observe_remote(self, probes: Probes) -> None:
        """Workers of other hosts as they attach and leave; hosts that join."""
        self.fleet.observe(probes)

    def _maybe_ready(self, probes: Probes) -> None:
        if self.ready_shown:
            return
        running = [c for c in self.children if not c.given_up]
        if running and all(c.up for c in running):
            self.ready_shown = True
            workers = [c.name for c in running if c.proc.role == "worker"]
            model = probes.model or self.model
            self.screen.ready(self.plan, model, workers, self.run_dir, self.fleet.rows())

    # ---------------------------------------------------------------- stop
    def stop_all(self) -> int:
        """SIGTERM the workers, then the gateway and router; SIGKILL every group still
        alive at the grace's end. Returns how many groups had to be killed."""
        deadline = time.monotonic() + (0.0 if self.hurry else self.grace_s)
        workers = [c for c in self.children if c.proc.role == "worker"]
        others = [c for c in self.children if c.proc.role != "worker"]
        _signal_all(workers, signal.SIGTERM)
        _wait_all(workers, min(deadline, time.monotonic() + self.grace_s / 2))
        _signal_all(others, signal.SIGTERM)
        _wait_all(self.children, deadline)
        killed = sum(c.alive() for c in self.children)
        _signal_all(self.children, signal.SIGKILL)  # also any grandchild left in a group
        for c in self.children:
            if c.popen is not None:
                c.popen.wait()
            for reader in c.readers:
                reader.join(timeout=1.0)
        _wait_groups_empty(self.children, time.monotonic() + 2.0)
        return killed


def _die_with_parent() -> None:
    """In the child before exec (Linux): SIGTERM when this supervisor dies, even by
    SIGKILL, so that no router is left holding its port. Elsewhere a no-op."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _signal_all(children: list[Child], sig: int) -> None:
    for c in children:
        if c.popen is None:
            continue
        with contextlib.suppress(ProcessLookupError):
            os.killpg(c.popen.pid, sig)  # its group: the pid of its leader


def _wait_all(children: list[Child], deadline: float) -> None:
    for c in children:
        if c.popen is None:
            continue
        with contextlib.suppress(subprocess.TimeoutExpired):
            c.popen.wait(timeout=max(0.0, deadline - time.monotonic()))


def _wait_groups_empty(children: list[Child], deadline: float) -> None:
    """Until ``deadline``, wait for the last live member of each child's group to die.
    SIGKILL is delivered asynchronously: a grandchild (re-parented, so not ours to
    wait for) can run for a few milliseconds after killpg returns, holding a port or
    a file. A zombie counts as gone; whoever adopted it reaps it."""
    groups = {c.popen.pid for c in children if c.popen is not None}
    while groups and time.monotonic() < deadline:
        groups = {g for g in groups if _group_has_live_member(g)}
        if groups:
            time.sleep(0.01)


def _group_has_live_member(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False  # the common case: no member at all, not even a zombie
    except PermissionError:
        pass
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):  # it may vanish meanwhile
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                return True
    return False


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"
