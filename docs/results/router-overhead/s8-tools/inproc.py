"""In-process: the router's turns for lone requests, inproc sockets, thread CPU per turn."""

import gc
import os
import statistics
import sys
import time
import uuid

import msgpack
import zmq

from tandem.bench import null_peers
from tandem.broker.router import Router, RouterConfig
from tandem.common import protocol as p
from tandem.common.settings import Addresses

CLOCK = time.perf_counter_ns if os.environ.get("CLK") == "wall" else time.thread_time_ns


def setup(kind="inproc"):
    if kind == "inproc":
        tag = uuid.uuid4().hex
        addrs = Addresses(f"inproc://c-{tag}", f"inproc://w-{tag}")
    else:
        from tandem.bench.router_overhead import _addr

        addrs = Addresses(_addr(), _addr())
    r = Router(RouterConfig(addresses=addrs))
    ctx = zmq.Context.instance()
    c = ctx.socket(zmq.DEALER)
    c.connect(r.client_sock.address)
    w = ctx.socket(zmq.DEALER)
    w.connect(r.worker_sock.address)
    w.send(p.encode(null_peers.ready("null", null_peers.tiny_spec(), with_spec=False)))
    time.sleep(0.05)
    for _ in range(5):
        r.turn(None)
        while w.poll(50):
            m = msgpack.unpackb(w.recv())
            if m.get("type") == "reregister":
                w.send(
                    p.encode(
                        null_peers.ready(
                            "null", null_peers.tiny_spec(), with_spec=bool(m.get("tokenizer", True))
                        )
                    )
                )
    assert r.workers, "no worker"
    return r, c, w


def one(r, c, w, i, times, gcs=None):
    cs, ws = r.client_sock.sock, r.worker_sock.sock
    c.send(p.encode(p.Submit(f"q{i}", tokens=[1, 2, 3], sampling=p.SamplingParams(1))))
    while not cs.poll(100):
        pass
    t0 = CLOCK()
    r.turn({cs: zmq.POLLIN})
    t1 = CLOCK()
    frame = w.recv()
    m = msgpack.unpackb(frame)
    rid = m["request_id"]
    stats = {"output_tokens": 1, "prompt_tokens": 1, "cached_tokens": 0}
    w.send(p.encode_batch([p.TokenDelta(rid, [7], "x"), p.Done(rid, p.FinishReason.LENGTH, stats)]))
    while not ws.poll(100):
        pass
    t2 = CLOCK()
    r.turn({ws: zmq.POLLIN})
    t3 = CLOCK()
    while True:
        out = msgpack.unpackb(c.recv())
        if out["type"] == "batch" and out["messages"][-1]["type"] == "done":
            break
        if out["type"] == "done":
            break
    times.append((t1 - t0, t3 - t2))


def main():
    n = int(sys.argv[1])
    kind = sys.argv[2] if len(sys.argv) > 2 else "inproc"
    r, c, w = setup(kind)
    gc.freeze()
    times = []
    for i in range(300):
        one(r, c, w, i, times)
    times.clear()
    for i in range(n):
        one(r, c, w, i, times)
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
