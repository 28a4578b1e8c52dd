"""In-process: the router's turns for lone requests, inproc sockets, thread CPU per turn."""

import gc
import importlib
import os
import statistics
import sys
import time
import uuid

import msgpack
import zmq

CLOCK = time.perf_counter_ns if os.environ.get("CLK") == "wall" else time.thread_time_ns


def setup(kind="inproc", pkg="tandem"):
    """A router of package ``pkg`` (dual.py: main's copy as ``tandem_base``) with a
    null worker registered; (router, client socket, worker socket, protocol module)."""
    R = importlib.import_module(pkg + ".broker.router")
    P = importlib.import_module(pkg + ".common.protocol")
    S = importlib.import_module(pkg + ".common.settings")
    N = importlib.import_module(pkg + ".bench.null_peers")
    if kind == "inproc":
        tag = uuid.uuid4().hex
        addrs = S.Addresses(f"inproc://c-{tag}", f"inproc://w-{tag}")
    else:
        new = importlib.import_module(pkg + ".bench.router_overhead")._addr
        addrs = S.Addresses(new(), new())
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
                spec = bool(m.get("tokenizer", True))
                w.send(P.encode(N.ready("null", N.tiny_spec(), with_spec=spec)))
    assert r.workers, "no worker"
    return r, c, w, P


def turns(r, c, w, P, i, clock=CLOCK):
    """One lone request through ``r``: the clock's time in its submit turn and in
    its worker turn."""
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
    return t1 - t0, t3 - t2


def one(r, c, w, P, i, times):
    times.append(turns(r, c, w, P, i))


def main():
    n = int(sys.argv[1])
    kind = sys.argv[2] if len(sys.argv) > 2 else "inproc"
    r, c, w, P = setup(kind)
    gc.freeze()
    times = []
    for i in range(300):
        one(r, c, w, P, i, times)
    times.clear()
    for i in range(n):
        one(r, c, w, P, i, times)
    a = statistics.median(t[0] for t in times) / 1e3
    b = statistics.median(t[1] for t in times) / 1e3
    ma = statistics.mean(t[0] for t in times) / 1e3
    mb = statistics.mean(t[1] for t in times) / 1e3
    print(
        f"{kind}: submit turn median {a:.1f} us (mean {ma:.1f}), "
        f"worker turn median {b:.1f} us (mean {mb:.1f}), sum median {a + b:.1f}"
    )


if __name__ == "__main__":
    main()
