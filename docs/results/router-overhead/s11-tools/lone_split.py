"""Where a lone request's time goes: the client's send and receive, the router's turn that
sends the Assign and its turn that answers the client (thread clocks are CLOCK_MONOTONIC in
every process). usage: lone_split.py [N]; PIN=1 pins router and the rest to different cores."""

import json
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil
from lone_path import lone_path, serve

from tandem.bench import router_overhead as ro


def inst_router(client, worker, stop):
    from tandem.broker.router import Router, RouterConfig
    from tandem.common.settings import Addresses

    logging.basicConfig(level=logging.ERROR)
    rec = []

    class R(Router):
        def turn(self, ready=None):
            t0 = time.perf_counter()
            self._mark = []
            more = super().turn(ready)
            t1 = time.perf_counter()
            if self._mark:
                rec.append((t0, t1, self._mark))
            return more

        def submit(self, identity, msg):
            self._mark.append(("s", msg.request_id))
            return super().submit(identity, msg)

        def relay(self, w, msg):
            req = self.requests.get(msg.request_id)
            if req is not None:
                self._mark.append(("d", req.submit.request_id))
            return super().relay(w, msg)

    r = R(RouterConfig(addresses=Addresses(client, worker)))
    for sock, tag in ((r.worker_sock, "W"), (r.client_sock, "C")):

        def wrap(f=sock.flush, tag=tag):
            def flush():
                out = f()
                r._mark.append((tag, time.perf_counter()))
                return out

            return flush

        sock.flush = wrap()
    try:
        serve(r, stop)
    finally:
        Path(tempfile.gettempdir(), "router_rec.json").write_text(json.dumps(rec))


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    with lone_path(inst_router) as (sock, procs):
        if os.environ.get("PIN"):
            rp = psutil.Process(procs[0].pid)
            for t in rp.threads():
                os.sched_setaffinity(t.id, {1})
            wp = psutil.Process(procs[1].pid)
            for t in wp.threads():
                os.sched_setaffinity(t.id, {0})
            os.sched_setaffinity(0, {0})
            for t in psutil.Process().threads():
                os.sched_setaffinity(t.id, {0})
        out = []
        for i in range(n):
            rid = f"z{i}"
            t0 = time.perf_counter()
            sock.send(ro._submit(rid, 1))
            while True:
                sock.poll(10000)
                msgs = ro._messages(sock.recv())
                if any(m.get("type") == "done" for m in msgs):
                    break
            out.append((rid, t0, time.perf_counter()))
    time.sleep(0.5)
    rec = json.loads(Path(tempfile.gettempdir(), "router_rec.json").read_text())
    turns = {}
    for t0, t1, marks in rec:
        ws = [t for k, t in marks if k == "W"]
        cs = [t for k, t in marks if k == "C"]
        for kind, rid in marks:
            if kind in ("s", "d"):
                sent = (ws[0] if ws else t1) if kind == "s" else (cs[0] if cs else t1)
                turns[(kind, rid)] = (t0, sent, t1)
    rows = []
    for rid, s, e in out:
        if ("s", rid) not in turns or ("d", rid) not in turns:
            continue
        a0, a1, a2 = turns[("s", rid)]
        b0, b1, b2 = turns[("d", rid)]
        rows.append((e - s, a0 - s, a1 - a0, b0 - a1, b1 - b0, e - b1, a2 - a1, b2 - b1))
    names = [
        "total",
        "c->r",
        "r to Assign",
        "r->w->r",
        "r to client",
        "r->c",
        "(submit tail)",
        "(done tail)",
    ]
    rows.sort()

    def show(sel, label):
        print(label, len(sel))
        for j, nm in enumerate(names):
            xs = [r[j] * 1e3 for r in sel]
            print(f"   {nm:14s} p50 {statistics.median(xs):.3f}  mean {statistics.mean(xs):.3f}")

    show(rows, "all")
    show([r for r in rows if r[0] > 1.5e-3], "slow (>1.5ms)")
    show([r for r in rows if r[0] < 1.0e-3], "fast (<1ms)")


if __name__ == "__main__":
    main()
