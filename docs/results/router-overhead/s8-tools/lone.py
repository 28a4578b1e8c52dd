"""Lone-request latency and router CPU per request (router in its own process).

usage: lone.py N ROUNDS  -> JSON lines: per round, router p50/p90, direct p50, added,
router main-thread CPU us/req, other threads us/req.
"""

import json
import statistics
import sys
import time

from tandem.bench import router_overhead as ro

N = int(sys.argv[1])
ROUNDS = int(sys.argv[2])
kinds = sys.argv[3].split(",") if len(sys.argv) > 3 else ["router", "direct"]


def lone(sock, n, tag):
    frames = [ro._submit(f"{tag}{i}", 1) for i in range(n)]
    _, _, lat = ro._drive(sock, frames, 1)
    return lat


def threads(pid):
    import os

    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
            run, wait, n = map(int, f.read().split())
        with open(f"/proc/{pid}/task/{tid}/comm") as f:
            name = f.read().strip()
        out[int(tid)] = (run, wait, n, name)
    return out


def main():
    for r in range(ROUNDS):
        out = {"round": r, "load": round(__import__("os").getloadavg()[0], 2)}
        for kind in kinds:
            with ro.path(kind) as (sock, pid):
                lone(sock, 300, "q")
                t0 = threads(pid)
                w0 = time.monotonic()
                lat = lone(sock, N, "q")
                wall = time.monotonic() - w0
                t1 = threads(pid)
            d = {
                k: [(t1[k][i] - t0.get(k, (0, 0, 0))[i]) / N for i in range(3)] + [t1[k][3]]
                for k in t1
            }
            main = d[pid][0] / 1e3
            other = sum(v[0] for k, v in d.items() if k != pid) / 1e3
            detail = {
                f"{v[3]}:{k % 1000}": [round(v[0] / 1e3, 1), round(v[1] / 1e3, 1), round(v[2], 2)]
                for k, v in d.items()
                if v[2] > 0.01
            }
            out[kind] = {
                "p50": round(statistics.median(lat) * 1e3, 4),
                "p10": round(sorted(lat)[len(lat) // 10] * 1e3, 4),
                "p90": round(sorted(lat)[9 * len(lat) // 10] * 1e3, 4),
                "main_us": round(main, 1),
                "other_us": round(other, 1),
                "wall_us": round(wall / N * 1e6, 1),
                "threads[run_us,rq_wait_us,slices]": detail,
            }
        if "router" in out and "direct" in out:
            out["added_p50"] = round(out["router"]["p50"] - out["direct"]["p50"], 4)
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
