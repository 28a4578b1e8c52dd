"""The req/s case round after round in one router process, with the router's garbage
collections timed (gc.callbacks): collections per request, seconds per generation, the
router's CPU per request. usage: busy_gc.py ROUNDS [T0,T1,T2] (gc thresholds to set in
the router; default: Python's)."""

import logging
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "s11-tools"))
from lone_path import lone_path, serve  # noqa: E402

from tandem.bench import router_overhead as ro  # noqa: E402


def gc_router(client, worker, stop):
    import gc
    import json
    import os
    import tempfile

    from tandem.broker.router import Router, RouterConfig
    from tandem.common.settings import Addresses

    logging.basicConfig(level=logging.ERROR)
    if os.environ.get("ROUTER_GC"):
        gc.set_threshold(*map(int, os.environ["ROUTER_GC"].split(",")))
    spent = [[0, 0.0] for _ in range(3)]
    started = {}

    def timed(phase, info):
        if phase == "start":
            started["t"] = time.perf_counter()
        else:
            row = spent[info["generation"]]
            row[0] += 1
            row[1] += time.perf_counter() - started["t"]
            Path(tempfile.gettempdir(), "router_gc.json").write_text(json.dumps(spent))

    if not os.environ.get("ROUTER_GC_QUIET"):  # the timing itself costs the router
        gc.callbacks.append(timed)
    serve(Router(RouterConfig(addresses=Addresses(client, worker))), stop)


def main():
    import json
    import os
    import tempfile

    rounds = int(sys.argv[1])
    if len(sys.argv) > 2:
        os.environ["ROUTER_GC"] = sys.argv[2]  # read by the router's process
    with lone_path(gc_router) as (sock, procs):
        proc = psutil.Process(procs[0].pid)
        gc_file = Path(tempfile.gettempdir(), "router_gc.json")
        for _ in range(rounds):
            frames = [ro._submit(f"q{i}", 1) for i in range(4000)]
            quiet = os.environ.get("ROUTER_GC_QUIET")
            before = json.loads(gc_file.read_text()) if gc_file.exists() else [[0, 0.0]] * 3
            c0 = proc.cpu_times()
            secs, _, _ = ro._drive(sock, frames, 256)
            c1 = proc.cpu_times()
            time.sleep(0.05)
            after = before if quiet else json.loads(gc_file.read_text())
            cpu = (c1.user + c1.system) - (c0.user + c0.system)
            gcs = [(a[0] - b[0], a[1] - b[1]) for a, b in zip(after, before, strict=True)]
            gc_us = sum(s for _, s in gcs) * 1e6 / len(frames)
            print(f"req/s {len(frames) / secs:.0f}  cpu/req {cpu * 1e6 / len(frames):.0f} us  "
                  f"gc/req {gc_us:.1f} us  collections {[n for n, _ in gcs]}")  # fmt: skip


if __name__ == "__main__":
    main()
