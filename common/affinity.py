"""Pinning a process to CPU cores (``--cpus 0-9,12``), so that workers, the router
and a benchmark sharing one host stop stealing each other's cores: on the GPU box,
identical runs differed by 20-45 % while they shared all 16."""

from __future__ import annotations

import logging
import os
import platform
from pathlib import Path

import psutil

log = logging.getLogger(__name__)

MAX_CPU_ID = 4095


def parse_cpus(text: str) -> tuple[int, ...]:
    """``"0-3,8"`` -> ``(0, 1, 2, 3, 8)``; ValueError names what is wrong."""
    cpus: set[int] = set()
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        try:
            first, last = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise ValueError(f"cpus {text!r}: {part!r} is not N or N-M") from None
        if not 0 <= first <= last <= MAX_CPU_ID:
            raise ValueError(f"cpus {text!r}: {part!r} is not an ascending range of core ids")
        cpus.update(range(first, last + 1))
    return tuple(sorted(cpus))


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what the platform says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def usable_cores() -> int:
    """The cores this process may run on (its affinity where the platform has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def pin(cpus: tuple[int, ...] | None) -> None:
    """Restrict this process (and threads it starts later) to ``cpus``; None: leave it.

    ValueError when a core does not exist here; a platform without affinity
    (macOS) logs that the request is ignored.
    """
    if not cpus:
        return
    proc = psutil.Process()
    if not hasattr(proc, "cpu_affinity"):
        log.warning("this platform cannot pin processes to cores; --cpus ignored")
        return
    have = psutil.cpu_count() or 1
    missing = [c for c in cpus if c >= have]
    if missing:
        raise ValueError(f"cpus {list(missing)} do not exist on this host ({have} cores)")
    proc.cpu_affinity(list(cpus))
    log.info("pinned to cores %s", ",".join(map(str, cpus)))
