"""The router loop's longest stall while clients send the largest prompts it admits.

``python studies/loop_stall.py`` starts a router and one sim worker (its
tokenizer is the default model's), streams one small request, and once tokens
flow sends ``--flood`` Submits of ``--chars`` characters each (16 x 1 Mi: the
admission limit) from another socket. Every token frame of the small stream is
timestamped on arrival: the longest gap while the flood is in the router is how
long its loop stood still (the sim worker steps every few ms; the gap before the
flood is the baseline). Raw DEALER sockets, not the client library: nothing but
the router between the timestamps.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import zmq

from tandem.common import protocol as p
from tandem.launcher.cluster import Cluster, WorkerSpec

SIM = ["--backend", "sim", "--profile", "gpu-m2", "--warmup", "off", "--heartbeat-s", "0.2"]
WORDS = ["the", "model", "router", "token", "stream", "worker", "cache", "12345", "hello,", "x."]


def _dealer(addr: str) -> zmq.Socket:
    sock: zmq.Socket = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(addr)
    return sock


def _prompt(rng: random.Random, chars: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(chars // 4))[:chars]


def measure(addr: str, flood: int, chars: int, seed: int) -> dict[str, object]:
    rng = random.Random(seed)
    prompts = [_prompt(rng, chars) for _ in range(flood)]  # before the clock starts
    stream, flooder = _dealer(addr), _dealer(addr)
    sampling = p.SamplingParams(4000, ignore_eos=True)
    stream.send(p.encode(p.Submit("small", tokens=[1, 2, 3], sampling=sampling)))
    arrivals: list[float] = []
    flood_at = flood_done = 0.0
    answered = 0
    deadline = time.perf_counter() + 120
    while time.perf_counter() < deadline:
        if stream.poll(0) or flooder.poll(5):
            now = time.perf_counter()
            while stream.poll(0):
                msgs = p.decode_all(stream.recv())
                if any(isinstance(m, p.TokenDelta) for m in msgs):
                    arrivals.append(now)
                if any(isinstance(m, p.Done | p.Error) for m in msgs):
                    deadline = 0.0
            while flooder.poll(0):
                answered += sum(
                    isinstance(m, p.Error | p.Done) for m in p.decode_all(flooder.recv())
                )
                if answered == flood and not flood_done:
                    flood_done = now
                    deadline = now + 1.0  # one more second of the stream after the flood
        if not flood_at and len(arrivals) >= 50:
            flood_at = time.perf_counter()
            for i, text in enumerate(prompts):
                flooder.send(p.encode(p.Submit(f"big{i}", prompt=text)))
    stream.send(p.encode(p.Cancel("small")))
    stream.close()
    flooder.close()
    gaps_before = [b - a for a, b in zip(arrivals, arrivals[1:], strict=False) if b <= flood_at]
    during = [b - a for a, b in zip(arrivals, arrivals[1:], strict=False) if b > flood_at]
    return {
        "flood": flood,
        "chars": chars,
        "flood_answered": answered,
        "flood_answered_after_s": round(flood_done - flood_at, 3) if flood_done else None,
        "baseline_max_gap_ms": round(max(gaps_before) * 1e3, 1),
        "baseline_median_gap_ms": round(statistics.median(gaps_before) * 1e3, 2),
        "flood_max_gap_ms": round(max(during) * 1e3, 1) if during else None,
        "flood_p99_gap_ms": round(sorted(during)[int(0.99 * (len(during) - 1))] * 1e3, 1)
        if during
        else None,
        "stream_frames": len(arrivals),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flood", type=int, default=16)
    ap.add_argument("--chars", type=int, default=1 << 20)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--seed", type=int, default=28)
    args = ap.parse_args()
    with Cluster(workers=[WorkerSpec("sim0", SIM)]) as cl:
        runs = [
            measure(cl.client_addr, args.flood, args.chars, args.seed + i) for i in range(args.runs)
        ]
    print(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
