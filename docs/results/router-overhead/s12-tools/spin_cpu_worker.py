"""A real llama.cpp worker (2 threads) behind routers with and without polling,
alternating: aggregate decode tok/s at 1 and 4 active (bench/baseline.py's
tandem_decode_tok_s) and the router's CPU seconds over them.
usage: spin_cpu_worker.py ROUNDS"""

import sys

import psutil

from tandem.bench.baseline import tandem_decode_tok_s
from tandem.launcher.cluster import Cluster, WorkerSpec

ARGS = ["--threads", "2", "--max-active", "4", "--heartbeat-s", "0.5"]

if __name__ == "__main__":
    for _ in range(int(sys.argv[1])):
        row = []
        for spin in ("0", "2000"):
            with Cluster(workers=[WorkerSpec("cpu0", ARGS)], router_args=["--spin-us", spin]) as cl:
                tandem_decode_tok_s(cl, 1, 8)  # warm
                router = psutil.Process(cl.procs["router"].pid)
                c0 = sum(router.cpu_times()[:2])
                one = tandem_decode_tok_s(cl, 1, 64)
                four = tandem_decode_tok_s(cl, 4, 64)
                cpu = sum(router.cpu_times()[:2]) - c0
            row.append(f"spin_us={spin}: 1 active {one:.1f} tok/s, 4 active {four:.1f}, "
                       f"router cpu {cpu:.2f} s")  # fmt: skip
        print("  |  ".join(row), flush=True)
