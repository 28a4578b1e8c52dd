"""One subprocess a fleet actor keeps running: started in its own process group,
tied to the actor's life (Linux: it gets SIGTERM when the actor's process dies,
even by SIGKILL), restarted with a growing backoff when it exits, its output in a
log file that the actor can hand to the head (``tail``)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

_PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None
_PR_SET_PDEATHSIG = 1
BACKOFF_MAX_S = 10.0
STABLE_S = 30.0  # up this long: the next exit restarts it after the shortest backoff
TAIL_BYTES = 64 * 1024  # what tail() reads from the end of a log, at most


def _tie_to_parent() -> None:
    # PDEATHSIG fires when the *thread* that forked exits: every Managed is started
    # from its actor's one supervision thread, which lives as long as the actor.
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM)


class Managed:
    """``python -m tandem ARGV`` with ``env`` added, logging to ``log``."""

    def __init__(self, name: str, argv: tuple[str, ...], env: dict[str, str], log: Path) -> None:
        self.name, self.argv, self.env, self.log = name, argv, env, log
        self.popen: subprocess.Popen[bytes] | None = None
        self.started_s = 0.0
        self.exits = 0  # quick exits in a row (the backoff's exponent)
        self.restarts = 0  # restarts since this Managed was made
        self.restart_at: float | None = None

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen is not None else None

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def start(self) -> None:
        with open(self.log, "ab") as out:
            out.write(f"--- {time.strftime('%H:%M:%S')} tandem {' '.join(self.argv)}\n".encode())
            out.flush()
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "tandem", *self.argv],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env},
                process_group=0,
                preexec_fn=_tie_to_parent,
            )
        self.started_s, self.restart_at = time.monotonic(), None

    def check(self, now: float) -> str | None:
        """Restart it when due; what happened, in words, when something did."""
        if self.restart_at is not None:
            if now < self.restart_at:
                return None
            self.start()
            self.restarts += 1
            return f"restarted (pid {self.pid})"
        if self.popen is None or self.popen.poll() is None:
            return None
        code = self.popen.returncode
        self.exits = 1 if now - self.started_s > STABLE_S else self.exits + 1
        # The first exit restarts at once (a router's every second is downtime); a
        # crash loop waits 0.5 s, then twice as long each time, up to BACKOFF_MAX_S.
        delay = 0.0 if self.exits == 1 else min(BACKOFF_MAX_S, 0.5 * 2.0 ** (self.exits - 2))
        self.restart_at = now + delay
        self._kill_group(signal.SIGKILL)  # whatever it left in its group
        return f"exited ({code}); restarting in {delay:.1f} s"

    def stop(self, grace_s: float = 3.0) -> None:
        """SIGTERM its group; SIGKILL what is left after ``grace_s``."""
        self.restart_at = None
        if self.popen is None:
            return
        self._kill_group(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=grace_s)
        self._kill_group(signal.SIGKILL)
        self.popen.wait()

    def tail(self, lines: int = 40) -> str:
        try:
            with open(self.log, "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - TAIL_BYTES))
                text = f.read().decode(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def _kill_group(self, sig: int) -> None:
        if self.popen is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.popen.pid, sig)
