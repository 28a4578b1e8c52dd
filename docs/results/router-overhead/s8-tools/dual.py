"""One process, both routers (main as tandem_base, the branch as tandem) on inproc
sockets, lone requests alternating between them: per-request thread CPU of each
router's two turns, in the same time window."""

import gc
import os
import statistics
import sys
import time

# PKGS: a folder holding main's package as tandem_base beside the branch's as tandem.
sys.path.insert(0, os.environ["PKGS"])
import inproc  # noqa: E402  (beside this file; after PKGS, whose tandem it imports)


def make(pkg):
    return inproc.setup(pkg=pkg)


def one(r, c, w, P, i, clock):
    return sum(inproc.turns(r, c, w, P, i, clock))


def main():
    n, blocks = int(sys.argv[1]), int(sys.argv[2])
    clock = time.thread_time_ns
    peers = {"base": make("tandem_base"), "branch": make("tandem")}
    gc.freeze()
    for _name, p in peers.items():
        for i in range(200):
            one(*p, i, clock)
    res = {k: [] for k in peers}
    ratios = []
    for _b in range(blocks):
        cur = {k: [] for k in peers}
        for i in range(n):
            for k, p in peers.items():
                cur[k].append(one(*p, i, clock))
        meds = {k: statistics.median(v) / 1e3 for k, v in cur.items()}
        for k in peers:
            res[k].append(meds[k])
        ratios.append(meds["branch"] / meds["base"])
    for k, v in res.items():
        print(
            f"{k:7s} per-request CPU (both turns) block medians: "
            f"med {statistics.median(v):.1f} us, range {min(v):.1f}-{max(v):.1f}"
        )
    print(
        f"branch/base per block: med {statistics.median(ratios):.3f}, "
        f"range {min(ratios):.3f}-{max(ratios):.3f}"
    )


if __name__ == "__main__":
    main()
