"""Measure the chaos scenarios of docs/results/reliability.md against any tandem tree.

Uses only what both the branch start (e7a8192) and the reliability branch have
(Cluster, Client, raw sockets, protocol messages), so the same scenarios give the
before and after figures. Sim workers, loopback only, every wait bounded.

    python docs/results/reliability/measure.py > after.jsonl
    PYTHONPATH=/tmp/base-farm python docs/results/reliability/measure.py > before.jsonl
"""

from __future__ import annotations

import datetime as dt
import json
import re
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from tandem.client import Client, TandemError
from tandem.common import protocol as p
from tandem.common.transport import DealerSocket
from tandem.launcher.cluster import Cluster, WorkerSpec

SIM = ["--backend", "sim", "--warmup", "off", "--heartbeat-s", "0.2"]
GPU, CPU = [*SIM, "--profile", "gpu-m2"], [*SIM, "--profile", "cpu-m2"]
WAIT_S = 20.0  # a client silent this long counts as "silent" (the CLI would wait 300 s)
try:
    from tandem.common.auth import make_keys
except ImportError:  # the branch start has no authentication
    make_keys = None


def prompt(i: int, n: int = 24) -> list[int]:
    return [1000 + (i * 131 + k * 7) % 30000 for k in range(n)]


class Run(threading.Thread):
    def __init__(self, addr: str, keys: str | None = None, **kw: Any) -> None:
        super().__init__(daemon=True)
        self.addr, self.keys, self.kw = addr, keys, kw
        self.ids: list[int] = []
        self.at: list[float] = []
        self.code, self.end = "", 0.0
        self.start()

    def run(self) -> None:
        extra = {"keys": self.keys} if self.keys else {}
        try:
            with Client(self.addr, timeout_s=WAIT_S, **extra) as c:
                s = c.stream(**self.kw)
                for d in s:
                    self.ids += d.token_ids
                    self.at.append(time.monotonic())
                self.code = "done"
        except TandemError as exc:
            self.code = "silent" if exc.code == "timeout" else str(exc.code)
        self.end = time.monotonic()


def refs(addr: str, prompts: list[list[int]], n: int) -> list[list[int]]:
    with Client(addr, timeout_s=60) as c:
        return [c.generate(tokens=t, max_tokens=n, ignore_eos=True).token_ids for t in prompts]


def until(check: Any, bound_s: float = 30.0) -> bool:
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return False


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def codes(runs: list[Run]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in runs:
        out[r.code] = out.get(r.code, 0) + 1
    return out


def kill9() -> dict:
    ws = [WorkerSpec("a", CPU), WorkerSpec("b", CPU)]
    with Cluster(workers=ws, router_args=["--policy", "round_robin"]) as cl:
        prompts = [prompt(i) for i in range(4)]
        runs = [Run(cl.client_addr, tokens=t, max_tokens=60, ignore_eos=True) for t in prompts]
        until(lambda: all(len(r.ids) >= 3 for r in runs))
        seen = [len(r.at) for r in runs]
        t0, wall0 = time.monotonic(), dt.datetime.now()
        cl.kill("a")
        for r in runs:
            r.join(WAIT_S + 10)
        good = sum(r.ids == f for r, f in zip(runs, refs(cl.client_addr, prompts, 60), strict=True))
        hit = [r for r, n in zip(runs, seen, strict=True) if r.code != "done" or len(r.at) > n]
        gaps = [(r.at[n] if len(r.at) > n and r.code == "done" else r.end) - t0
                for r, n in zip(runs, seen, strict=True) if r in hit]  # fmt: skip
        return dict(requests=4, faults=1, codes=codes(runs), correct=good,
                    detect_s=_removed_after(cl.log("router"), "a", wall0),
                    detect_and_recover_s=round(max(gaps), 2))  # fmt: skip


def _removed_after(log: str, worker: str, since: dt.datetime) -> float | None:
    """Seconds from ``since`` to the router's log line removing ``worker``."""
    m = re.search(rf"^(\S+ \S+) W \S+: worker {worker} removed: (.*)$", log, re.M)
    if not m:
        return None
    at = dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f")
    return round((at - since).total_seconds(), 3)


def restart() -> dict:
    with Cluster(workers=[WorkerSpec("w", GPU)]) as cl:
        prompts = [prompt(100 + i) for i in range(16)]
        want = refs(cl.client_addr, prompts, 40)
        long = [Run(cl.client_addr, tokens=prompt(200 + i), max_tokens=2000, ignore_eos=True)
                for i in range(3)]  # fmt: skip
        until(lambda: all(len(r.ids) >= 5 for r in long))
        t0 = time.monotonic()
        cl.kill("router")
        time.sleep(0.5)
        cl.start_router()
        cl.wait_for_workers({"w"})
        runs = [Run(cl.client_addr, tokens=t, max_tokens=40, ignore_eos=True) for t in prompts]
        for r in long + runs:
            r.join(WAIT_S + 10)
        good = sum(r.ids == f for r, f in zip(runs, want, strict=True))
        foreign = sum(r.code == "done" and r.ids != f for r, f in zip(runs, want, strict=True))
        end_s = round(max(r.end for r in long) - t0, 2)
        return dict(in_flight=3, in_flight_codes=codes(long), in_flight_end_s=end_s, new=16,
                    new_codes=codes(runs), new_correct=good, new_wrong_text=foreign)  # fmt: skip


def flood(n: int = 3000, bound_s: float = 60.0) -> dict:
    with Cluster(workers=[WorkerSpec("w", [*GPU, "--max-active", "2"])]) as cl:
        pid = cl.procs["router"].pid
        before = rss_mb(pid)
        sock, big = DealerSocket(cl.client_addr), prompt(8, 2000)
        t0 = time.monotonic()
        for i in range(n):
            sock.send(p.Submit(f"f{i}", tokens=big, sampling=p.SamplingParams(8), stream=False))
        ended: dict[str, str] = {}
        accepted = 0
        while len(ended) < n and time.monotonic() - t0 < bound_s:
            if sock.poll(100):
                m = sock.recv()
                accepted += isinstance(m, p.Accepted)
                if isinstance(m, p.Done | p.Error):
                    ended[m.request_id] = "done" if isinstance(m, p.Done) else str(m.code)
        first_answer_all_s = round(time.monotonic() - t0, 1)
        out: dict[str, int] = {}
        for c in ended.values():
            out[c] = out.get(c, 0) + 1
        res = dict(requests=n, within_s=bound_s, codes=out, unanswered=n - len(ended),
                   accepted=accepted, worker_expiries=cl.log("router").count(" removed: "),
                   router_rss_mb=[before, rss_mb(pid)], elapsed_s=first_answer_all_s)  # fmt: skip
        sock.close()
        return res


def stranger() -> dict:
    keys = None
    if make_keys is not None:
        keys = tempfile.mkdtemp(prefix="tandem-keys-")
        make_keys(Path(keys))
    kw = {"keys": keys} if keys else {}
    with Cluster(workers=[WorkerSpec("w", GPU)], **kw) as cl:
        extra = {"keys": keys} if keys else {}
        with Client(cl.client_addr, **extra) as c:
            model = c.status().workers[0]["model"]
        fake = DealerSocket(cl.worker_addr, identity=b"fake")
        fake.send(_ready("fake", model))
        time.sleep(1.0)
        runs = [Run(cl.client_addr, keys, tokens=prompt(i), max_tokens=5) for i in range(10)]
        leaked = 0
        deadline = time.monotonic() + WAIT_S
        while any(r.is_alive() for r in runs) and time.monotonic() < deadline:
            while fake.poll(50):
                m = fake.recv()
                if isinstance(m, p.Assign):
                    leaked += 1
                    fake.send(p.TokenDelta(m.request_id, [7], "FORGED"))
                    fake.send(p.Done(m.request_id, "length", {}))
        fake.close()
        return dict(requests=10, authenticated=bool(keys), prompts_to_stranger=leaked,
                    codes=codes(runs))  # fmt: skip


def _ready(wid: str, model: str, rate: float = 1e6) -> p.Ready:
    return p.Ready(wid, "sim", "fake", model, 4, 8192, 16, rate, [rate] * 4, 0.2, {})


def inject() -> dict:
    with Cluster(workers=[WorkerSpec("w", CPU)]) as cl:
        with Client(cl.client_addr) as c:
            model = c.status().workers[0]["model"]
        evil = DealerSocket(cl.worker_addr, identity=b"evil")
        evil.send(_ready("evil", model, rate=1.0))
        epoch = ""
        if evil.poll(5000):
            epoch = getattr(evil.recv(), "epoch", "")
        prompts = [prompt(300 + i) for i in range(4)]
        runs = [Run(cl.client_addr, tokens=t, max_tokens=30, ignore_eos=True, worker="w")
                for t in prompts]  # fmt: skip
        while any(r.is_alive() for r in runs):
            for k in range(1, 40):
                rid = f"{epoch}.{k:x}" if epoch else f"{k:x}"
                evil.send(p.TokenDelta(rid, [7], "FORGED"))
            time.sleep(0.05)
        want = refs(cl.client_addr, prompts, 30)
        wrong = sum(r.ids != f for r, f in zip(runs, want, strict=True))
        evil.send(_ready("w", model))  # now claim the real worker's id
        time.sleep(1.0)
        evictions = cl.log("router").count("worker w removed")
        evil.close()
        return dict(requests=4, codes=codes(runs), streams_with_forged_tokens=wrong,
                    real_worker_evicted=evictions)  # fmt: skip


def oversize() -> dict:
    with Cluster(workers=[WorkerSpec("w", GPU)]) as cl:
        runs, t0 = [], time.monotonic()
        runs = [Run(cl.client_addr, prompt="x" * (4 << 20), max_tokens=4) for _ in range(3)]
        for r in runs:
            r.join(WAIT_S + 10)
        answered_s = round(max(r.end for r in runs) - t0, 2)
        return dict(requests=3, prompt_bytes=4 << 20, codes=codes(runs), answered_s=answered_s,
                    worker_expiries=cl.log("router").count(" removed: "))  # fmt: skip


def fuzz(n: int = 100_000) -> dict:
    """Random bytes and random msgpack maps on both sockets; the router must stay up."""
    import random

    import msgpack

    rnd = random.Random(11)
    with Cluster(workers=[WorkerSpec("w", GPU)]) as cl:
        pid = cl.procs["router"].pid
        before = rss_mb(pid)
        socks = [DealerSocket(cl.client_addr), DealerSocket(cl.worker_addr, identity=b"fz")]
        for i in range(n):
            if i % 2:
                frame = rnd.randbytes(rnd.randrange(1, 200))
            else:
                body = {
                    "v": 2,
                    "type": rnd.choice(["submit", "ready", "heartbeat", "done"]),
                    "request_id": str(i),
                    "x": [rnd.random() for _ in range(rnd.randrange(9))],
                }
                frame = msgpack.packb(body)  # fmt: skip
            socks[i % 2].sock.send(frame)
            while socks[i % 2].poll(0):
                socks[i % 2].sock.recv()
        time.sleep(1.0)
        with Client(cl.client_addr, timeout_s=30) as c:
            ok = len(c.generate(tokens=prompt(1), max_tokens=4).token_ids) == 4
        for s_ in socks:
            s_.close()
        return dict(frames=n, router_alive_and_serving=ok, router_rss_mb=[before, rss_mb(pid)],
                    worker_expiries=cl.log("router").count(" removed: "))  # fmt: skip


SCENARIOS = dict(fuzz=fuzz, kill9=kill9, restart=restart, flood=flood, stranger=stranger,
                 inject=inject, oversize=oversize)  # fmt: skip

if __name__ == "__main__":
    for name in sys.argv[1:] or list(SCENARIOS):
        t = time.monotonic()
        try:
            out = SCENARIOS[name]()
        except Exception as exc:  # a scenario that breaks the system is a figure too
            out = {"failed": f"{type(exc).__name__}: {exc}"[:300]}
        print(json.dumps({"scenario": name, **out, "took_s": round(time.monotonic() - t, 1)}),
              flush=True)  # fmt: skip
