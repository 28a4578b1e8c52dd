"""Adversarial frames against a live router, on both sockets; its memory must stay flat.

``python studies/frame_fuzz.py --frames 200000`` starts a router process (no
worker: nothing but the boundary is measured), then sends ``frames`` frames to its
client socket and as many to its worker socket from a seeded corpus: values nested
past the limit (up to 5,000 deep), headers claiming 4 G items, random bytes, every
message type with random or mistyped fields, batches of such entries, truncated
and bit-flipped valid frames, other versions. It reads the router's replies as it
goes (a peer that never reads them is another test: the router drops, and logs at
a bounded rate). It prints frames/s per socket, the router's RSS before (after a
warm-up of 10,000 frames a socket) and after, and the refusals by reason from /metrics.
"""

from __future__ import annotations

import argparse
import json
import random
import time
import timeit
import urllib.request
from collections.abc import Callable
from functools import partial

import msgpack
import psutil
import zmq

from tandem.common import protocol as p
from tandem.launcher.cluster import Cluster, free_tcp_port

V = p.PROTOCOL_VERSION
VALID = [
    p.encode(m)
    for m in (
        p.Hello("x"),
        p.Submit("r", prompt="hi", sampling=p.SamplingParams(4)),
        p.Cancel("r"),
        p.Heartbeat("w", 1, [p.RequestRow("a", 9, 0, 0, 4)], [], 1, 9, p.CacheReport(True, 1)),
        p.StepTokens(["a", "b"], [[1], [2]], ["x", "y"]),
        p.Done("a", p.FinishReason.LENGTH, p.DoneStats(output_tokens=1)),
    )
]
HUGE = [b"\xdd\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff", b"\xdb\xff\xff\xff\xff",
        b"\xc6\x7f\xff\xff\xff", b"\xc9\x7f\xff\xff\xff\x01"]  # fmt: skip
HOLE = msgpack.packb("\x00hole\x00")


def _value(rng: random.Random, depth: int = 0) -> object:
    kind = rng.randrange(9 if depth < 3 else 6)
    if kind == 6:
        return [_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    if kind == 7:
        return {str(rng.randrange(9)): _value(rng, depth + 1) for _ in range(rng.randrange(4))}
    scalars = (
        None,
        rng.random() < 0.5,
        rng.randint(-(2**63), 2**64 - 1),
        float("nan"),
        "x" * rng.randrange(40),
        b"\x00" * rng.randrange(8),
        None,
        None,
        {rng.randrange(9): 1},
    )  # fmt: skip (the last: a key that is not a string)
    return scalars[kind]


def _raw(rng: random.Random) -> bytes:
    """A value that cannot be packed by a packer: too deep or claiming too much."""
    if rng.random() < 0.7:
        head = b"\x91" if rng.random() < 0.5 else b"\x81\xa1k"
        return head * rng.randint(101, 5000) + b"\x01"
    return rng.choice(HUGE)


def _message(rng: random.Random, in_batch: bool = False) -> bytes:
    tag = rng.choice(sorted(p.MESSAGE_TYPES))
    names = [f for f in p.MESSAGE_TYPES[tag].__struct_fields__ if f != "v"]
    body: dict[object, object] = {} if in_batch else {"v": rng.choice([V, V, V, 4, "5"])}
    body["type"] = tag
    hole = None
    for name in names:
        roll = rng.random()
        if roll < 0.15 and hole is None:
            body[name], hole = "\x00hole\x00", _raw(rng)
        elif roll < 0.8:
            body[name] = _value(rng)
    items = list(body.items())
    rng.shuffle(items)  # "type" anywhere: msgspec skips what comes before it
    frame = msgpack.packb(dict(items), use_bin_type=True)
    return frame.replace(HOLE, hole, 1) if hole is not None else frame


def adversarial(rng: random.Random) -> bytes:
    roll = rng.random()
    if roll < 0.25:  # the reported shape, at random depths and in random fields
        return (
            _message(rng) if rng.random() < 0.5 else b"\x82\xa1v" + _raw(rng) + b"\xa4type\xa5hello"
        )
    if roll < 0.55:
        return _message(rng)
    if roll < 0.65:
        return p.join_batch([_message(rng, in_batch=True) for _ in range(rng.randrange(1, 6))])
    if roll < 0.75:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(300)))
    frame = bytearray(rng.choice(VALID))
    if roll < 0.85:
        return bytes(frame[: rng.randrange(len(frame))])
    for _ in range(rng.randrange(1, 4)):
        frame[rng.randrange(len(frame))] = rng.randrange(256)
    return bytes(frame)


def blast(addr: str, corpus: list[bytes], n: int, marker: str) -> float:
    """Send ``n`` frames of ``corpus`` in turn, reading replies as they come; returns
    the seconds until the router answered the marker frame sent last (it handles a
    peer's frames in order)."""
    sock: zmq.Socket = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.connect(addr)
    end = msgpack.packb({"v": V, "type": "cancel", "request_id": marker, "x": 1})
    start = time.perf_counter()
    try:
        for i in range(n):
            sock.send(corpus[i % len(corpus)])
            while sock.poll(0):
                sock.recv()
        sock.send(end)
        while sock.poll(60_000):  # the router batches what one turn owes a peer
            for reply in p.decode_all(sock.recv()):
                if getattr(reply, "request_id", None) == marker:
                    return time.perf_counter() - start
        raise RuntimeError("the router stopped answering")
    finally:
        sock.close()


def refusals(url: str) -> dict[str, float]:
    text = urllib.request.urlopen(url, timeout=30).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("tandem_frames_rejected_total{"):
            labels, value = line.rsplit(" ", 1)
            out[labels.split("{", 1)[1].rstrip("}")] = float(value)
    return out


def scan_cost(repeat: int = 5) -> dict[str, dict[str, float]]:
    """ns per frame of ``protocol.decode`` with the nesting scan and without it (the
    scan replaced by nothing, as before it existed), and of the scan alone, for the
    frames the router reads hot and a few large ones; best of ``repeat`` runs."""
    frames = {
        "tokens": p.TokenDelta("w-123", [4242], " word"),
        "step_tokens_16": p.StepTokens(
            [f"w{i}" for i in range(16)], [[40_000 + i] for i in range(16)], [" tok"] * 16
        ),  # fmt: skip
        "submit": p.Submit("r-1", prompt="Tell me a story. " * 8, sampling=p.SamplingParams(64)),
        "heartbeat_16": p.Heartbeat(
            "w",
            7,
            [p.RequestRow(f"w{i}", 500, 256, 0, 40) for i in range(16)],
            [],
            3000,
            8192,
            p.CacheReport(False, 7, base=7),
        ),  # fmt: skip
        "step_tokens_128": p.StepTokens(
            [f"w{i}" for i in range(128)], [[40_000 + i] for i in range(128)], [" tok"] * 128
        ),  # fmt: skip
        "submit_tokens_4k": p.Submit("r-2", tokens=[(i * 7919) % 49_152 for i in range(4096)]),
    }
    out = {}
    real_scan = p.scan
    for name, msg in frames.items():
        frame = p.encode(msg)
        n = max(20, 200_000 // max(1, len(frame) // 16))
        row = {"bytes": float(len(frame))}
        for label, scan in (("decode_with_scan_ns", real_scan), ("decode_without_ns", None)):
            p.scan = real_scan if scan else _no_scan
            try:
                row[label] = _best_ns(partial(p.decode, frame), n, repeat)
            finally:
                p.scan = real_scan
        row["scan_alone_ns"] = _best_ns(partial(real_scan, frame), n, repeat)
        out[name] = row
    return out


def _no_scan(frame: bytes) -> None:
    return None


def _best_ns(fn: Callable[[], object], n: int, repeat: int) -> float:
    return round(min(timeit.repeat(fn, number=n, repeat=repeat)) / n * 1e9)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=200_000, help="per socket")
    ap.add_argument("--corpus", type=int, default=5_000, help="distinct frames")
    ap.add_argument("--seed", type=int, default=28)
    ap.add_argument("--cost", action="store_true", help="only the scan's cost per frame")
    args = ap.parse_args()
    if args.cost:
        print(json.dumps(scan_cost(), indent=1))
        return
    rng = random.Random(args.seed)
    corpus = [adversarial(rng) for _ in range(args.corpus)]
    port = free_tcp_port()
    out: dict[str, object] = {"frames_per_socket": args.frames, "corpus": args.corpus}
    with Cluster(router_args=["--metrics-port", str(port)], transport="tcp") as cl:
        router = psutil.Process(cl.procs["router"].pid)
        blast(cl.client_addr, corpus, 10_000, "warm-c")
        blast(cl.worker_addr, corpus, 10_000, "warm-w")
        out["rss_before_mb"] = router.memory_info().rss / 2**20
        for side, addr in (("client", cl.client_addr), ("worker", cl.worker_addr)):
            took_s = blast(addr, corpus, args.frames, f"end-{side}")
            out[f"{side}_frames_per_s"] = round(args.frames / took_s)
            out[f"rss_after_{side}_mb"] = router.memory_info().rss / 2**20
        out["router_alive"] = cl.procs["router"].poll() is None
        out["refusals"] = refusals(f"http://127.0.0.1:{port}/metrics")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
