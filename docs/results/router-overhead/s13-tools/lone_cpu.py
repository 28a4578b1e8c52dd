"""Lone requests (one at a time, max_tokens 1) through the bench's router path: the
median round trip and the router process's CPU per request. usage: lone_cpu.py [N]"""

import statistics
import sys
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "s11-tools"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "s12-tools"))

from spin import lone_path, lone_requests, plain_router  # noqa: E402


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    with lone_path(plain_router) as (sock, procs):
        proc = psutil.Process(procs[0].pid)
        lone_requests(sock, 200)  # warm
        t = proc.cpu_times()
        cpu0 = t.user + t.system
        times = lone_requests(sock, n)
        t = proc.cpu_times()
        cpu = t.user + t.system - cpu0
        print(f"p50 {statistics.median(times):.3f} ms  router cpu/request {1e6 * cpu / n:.0f} us")


if __name__ == "__main__":
    main()
