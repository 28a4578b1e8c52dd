"""Side by side: base router, branch router, direct worker; lone requests alternating.
usage: side.py N ROUNDS"""

import json
import os
import statistics
import subprocess
import sys

import zmq

from tandem.bench import router_overhead as ro

HERE = os.path.dirname(os.path.abspath(__file__))
PY = os.environ.get("PY", sys.executable)
# Two checkouts, each with the rooms linked under tandem/ (BASE and BR: their roots).
TREES = {"base": os.environ["BASE"], "branch": os.environ["BR"]}


def spawn(tree, *args):
    env = dict(os.environ, PYTHONPATH=tree)
    return subprocess.Popen([PY, os.path.join(HERE, "peer.py"), *args], env=env, cwd=tree)


def sched(pid):
    with open(f"/proc/{pid}/task/{pid}/schedstat") as f:
        run, wait, n = map(int, f.read().split())
    return run, wait


def main():
    n, rounds = int(sys.argv[1]), int(sys.argv[2])
    procs, socks, pids = [], {}, {}
    ctx = zmq.Context.instance()
    for name, tree in TREES.items():
        c, w = ro._addr(), ro._addr()
        r = spawn(tree, "router", c, w)
        procs.append(r)
        pids[name] = r.pid
        procs.append(spawn(tree, "worker", w, "router"))
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(c)
        socks[name] = s
    for name in os.environ.get("EXTRA", "").split(","):
        if not name:
            continue
        c, w = ro._addr(), ro._addr()
        r = spawn(TREES["branch"], name, c, w)
        procs.append(r)
        pids[name] = r.pid
        procs.append(spawn(TREES["branch"], "worker", w, "router"))
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(c)
        socks[name] = s
    if os.environ.get("ONLY"):
        keep = os.environ["ONLY"].split(",")
        for k in [k for k in TREES if k not in keep]:
            socks.pop(k).close(0)
            pids.pop(k)
    d = ro._addr()
    procs.append(spawn(TREES["base"], "worker", d, "direct"))
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(d)
    socks["direct"] = s
    try:
        for s in socks.values():
            ro._warm(s)
        for s in socks.values():
            ro._drive(s, [ro._submit(f"q{i}", 1) for i in range(300)], 1)
        out = []
        for _ in range(rounds):
            lat = {k: [] for k in socks}
            cpu0 = {k: sched(p) for k, p in pids.items()}
            cpu1 = {}
            if os.environ.get("SEQ"):
                frames = [ro._submit(f"q{i}", 1) for i in range(n)]
                for k, s in socks.items():
                    c0 = sched(pids[k]) if k in pids else None
                    try:
                        _, _, lat[k] = ro._drive(s, frames, 1)
                    except RuntimeError as exc:
                        raise RuntimeError(f"{k}: {exc}") from None
                    if k in pids:
                        c1 = sched(pids[k])
                        cpu0[k], cpu1[k] = c0, c1
            else:
                for _i in range(n):
                    for k, s in socks.items():
                        _, _, one = ro._drive(s, [ro._submit("q0", 1)], 1)
                        lat[k].append(one[0])
                cpu1 = {k: sched(p) for k, p in pids.items()}
            row = {k: round(statistics.median(v) * 1e3, 4) for k, v in lat.items()}
            for k in pids:
                row[f"{k}_cpu_us"] = round((cpu1[k][0] - cpu0[k][0]) / n / 1e3, 1)
                row[f"{k}_rqwait_us"] = round((cpu1[k][1] - cpu0[k][1]) / n / 1e3, 1)
                row[f"{k}_added"] = round(row[k] - row["direct"], 4)
            row["load"] = round(os.getloadavg()[0], 2)
            if not os.environ.get("QUIET"):
                print(json.dumps(row), flush=True)
            out.append(row)

        def q(xs, f):
            xs = sorted(xs)
            return xs[min(len(xs) - 1, int(f * len(xs)))]

        summary = {}
        for k in out[0]:
            if k == "load":
                continue
            xs = [r[k] for r in out]
            summary[k] = {
                "p25": round(q(xs, 0.25), 3),
                "med": round(statistics.median(xs), 3),
                "p75": round(q(xs, 0.75), 3),
            }
        print(json.dumps({"rounds": len(out), "n": n, "summary": summary}, indent=None), flush=True)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(5)


if __name__ == "__main__":
    main()
