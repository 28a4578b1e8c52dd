"""One process, both routers (main as tandem_base, the branch as tandem) on inproc
sockets, lone requests alternating between them: per-request thread CPU of each
router's two turns, in the same time window."""

import gc
import importlib
import os
import statistics
import sys
import time
import uuid

import msgpack
import zmq

# PKGS: a folder holding main's package as tandem_base beside the branch's as tandem.
sys.path.insert(0, os.environ["PKGS"])


def make(pkg):
    R = importlib.import_module(pkg + ".broker.router")
    P = importlib.import_module(pkg + ".common.protocol")
    S = importlib.import_module(pkg + ".common.settings")
    N = importlib.import_module(pkg + ".bench.null_peers")
    tag = uuid.uuid4().hex
    addrs = S.Addresses(f"inproc://c-{tag}", f"inproc://w-{tag}")
    r = R.Router(R.RouterConfig(addresses=addrs))
    ctx = zmq.Context.instance()
    c = ctx.socket(zmq.DEALER)
    c.connect(r.client_sock.address)
    w = ctx.socket(zmq.DEALER)
    w.connect(r.worker_sock.address)
    w.send(P.encode(N.ready("null", N.tiny_spec(), with_spec=False)))
    time.sleep(0.05)
    for _ in range(5):
        r.turn(None)
        while w.poll(50):
            m = msgpack.unpackb(w.recv())
            if m.get("type") == "reregister":
                w.send(
                    P.encode(
                        N.ready("null", N.tiny_spec(), with_spec=bool(m.get("tokenizer", True)))
                    )
                )
    assert r.workers
    return r, c, w, P


def one(r, c, w, P, i, clock):
    cs, ws = r.client_sock.sock, r.worker_sock.sock
    c.send(P.encode(P.Submit(f"q{i}", tokens=[1, 2, 3], sampling=P.SamplingParams(1))))
    while not cs.poll(100):
        pass
    t0 = clock()
    r.turn({cs: zmq.POLLIN})
    t1 = clock()
    rid = msgpack.unpackb(w.recv())["request_id"]
    stats = {"output_tokens": 1, "prompt_tokens": 1, "cached_tokens": 0}
    w.send(P.encode_batch([P.TokenDelta(rid, [7], "x"), P.Done(rid, P.FinishReason.LENGTH, stats)]))
    while not ws.poll(100):
        pass
    t2 = clock()
    r.turn({ws: zmq.POLLIN})
    t3 = clock()
    while True:
        out = msgpack.unpackb(c.recv())
        if out["type"] == "done" or (
            out["type"] == "batch" and out["messages"][-1]["type"] == "done"
        ):
            break
    return (t1 - t0) + (t3 - t2)


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
