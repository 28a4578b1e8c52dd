"""What one hostile peer can make a router process hold or believe (issue 38, 1-2).

Three scenarios against a real `tandem router` process on loopback, each from an
outside peer's sockets:

- ``flood``: a registered worker sends delta cache reports of 100,000 new block
  hashes every 50 ms; the router's RSS after ``--seconds``.
- ``liar``: two fake workers serve at the same real speed (tests/liar.py); one
  claims 100x it. Which worker each of 90 requests went to, and the liar's priced
  batch-1 rate at the end.
- ``connections``: ``--idle`` idle DEALER connections from 127.0.0.1 to the client
  socket; the router's open descriptors, and whether a new client still gets an
  answer, from the same address and from another one (127.0.0.2, loopback too).

``--src DIR`` runs the router from another checkout's source tree (``git archive
REV | tar -x -C DIR``) with this venv, for the numbers before a change. Results:
docs/results/reliability.md. Run:
``.venv/bin/python -m studies.peer_bounds [--seconds 30] [--src DIR]``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import zmq

from tandem.client import Client, TandemError
from tandem.common import protocol as p
from tandem.common.transport import DealerSocket
from tests.helpers import fake_ready, tiny_tokenizer
from tests.liar import HONEST, PREFILL_TOK_S, FakeWorker, Traffic


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# Imports ``tandem`` (its folder) and ``tandem.<x>`` (folder <x>) from SRC first: the
# checkout's layout, as the project's package-dir maps it.
_BOOT = """
import importlib.util, sys
from pathlib import Path
SRC = Path(sys.argv.pop(1))
class Checkout:
    @staticmethod
    def find_spec(name, path=None, target=None):
        parts = name.split(".")
        if parts[0] != "tandem":
            return None
        base = SRC.joinpath("tandem" if len(parts) == 1 else parts[1], *parts[2:])
        init = base / "__init__.py"
        if init.is_file():
            return importlib.util.spec_from_file_location(name, init,
                                                          submodule_search_locations=[str(base)])
        mod = base.with_suffix(".py")
        return importlib.util.spec_from_file_location(name, mod) if mod.is_file() else None
if str(SRC) != ".":
    sys.meta_path.insert(0, Checkout)
from tandem.cli.main import main
main()
"""


class RouterProcess:
    def __init__(self, src: str, log: Path) -> None:
        self.client = f"tcp://127.0.0.1:{_free_port()}"
        self.worker = f"tcp://127.0.0.1:{_free_port()}"
        cmd = [sys.executable, "-c", _BOOT, src, "router",
               "--client-addr", self.client, "--worker-addr", self.worker]  # fmt: skip
        self.log = log
        self.proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:  # up once it answers a status query
            try:
                with Client(self.client, timeout_s=5) as c:
                    c.status()
                return
            except TandemError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.stop()  # none left behind
                    raise
                time.sleep(0.5)

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def _register(r: RouterProcess, wid: str, rates: tuple[float, list[float]]) -> DealerSocket:
    sock = DealerSocket(r.worker, identity=wid.encode())
    sock.send(fake_ready(wid, rates, len(rates[1]), tiny_tokenizer()))
    while not isinstance(sock.recv(), p.Welcome):
        pass
    return sock


def flood(r: RouterProcess, seconds: float) -> dict[str, float]:
    sock = _register(r, "flood", (1000.0, [50.0]))
    before = r.rss_mb()
    seq, t_end = 1, time.monotonic() + seconds
    sock.send(p.Heartbeat("flood", 1, [], [], 0, 8192, p.CacheReport(full=True, seq=1)))
    while time.monotonic() < t_end:
        added = list(range(seq * 100_000, (seq + 1) * 100_000))
        cache = p.CacheReport(full=False, base=seq, seq=seq + 1, added=added)
        seq += 1
        sock.send(p.Heartbeat("flood", seq, [], [], 0, 8192, cache))
        while sock.poll(0):
            sock.recv()
        time.sleep(0.05)
    time.sleep(1.0)  # let the router read what is queued
    out = {"rss_before_mb": round(before, 1), "rss_after_mb": round(r.rss_mb(), 1),
           "reports": seq - 1, "seconds": seconds}  # fmt: skip
    sock.close()
    return out


def liar(r: RouterProcess, n: int = 90) -> dict[str, object]:
    honest = FakeWorker("honest", _register(r, "honest", (PREFILL_TOK_S, HONEST)))
    lying = [x * 100 for x in HONEST]
    fake = FakeWorker("liar", _register(r, "liar", (PREFILL_TOK_S * 100, lying)))
    traffic = Traffic(DealerSocket(r.client))
    deadline = time.monotonic() + 120
    while len(traffic.routed) < n and time.monotonic() < deadline:
        while len(traffic.open) < traffic.concurrency and traffic.sent < n:
            traffic.submit_one()
        now = time.monotonic()
        honest.step(now)
        fake.step(now)
        traffic.read()
        time.sleep(0.005)
    with Client(r.client, timeout_s=30) as c:
        row = next(w for w in c.status().workers if w["id"] == "liar")
    third = traffic.routed[-n // 3 :]
    return {
        "requests": len(traffic.routed),
        "liar_share": round(traffic.routed.count("liar") / max(1, len(traffic.routed)), 2),
        "liar_share_last_third": round(third.count("liar") / max(1, len(third)), 2),
        "liar_priced_batch1_tok_s": row["priced_decode_tok_s"][0],
        "liar_real_batch1_tok_s": HONEST[0],
        "served": row.get("served"),
    }


def connections(r: RouterProcess, idle: int) -> dict[str, object]:
    fds_before = r.fds()
    ctx = zmq.Context()  # a context of their own: the default holds 1,023 sockets
    ctx.set(zmq.MAX_SOCKETS, idle + 16)
    socks = []
    for _ in range(idle):  # idle DEALERs: connected, handshaken, never a frame
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(r.client)
        socks.append(s)
    time.sleep(5.0)  # handshakes done or refused
    fds_idle = r.fds()
    answered = {}
    # The same address as the idle ones, and another loopback one (source;destination).
    for name, addr in (("same", r.client), ("other", r.client.replace("//", "//127.0.0.2:0;"))):
        try:
            with Client(addr, timeout_s=5) as c:
                c.status()
            answered[name] = True
        except TandemError:  # refused or unanswered: the finding
            answered[name] = False
    for s in socks:
        s.close()
    ctx.term()
    logged = r.log.read_text().count("refusing connections from")
    return {"idle": idle, "router_fds_before": fds_before, "router_fds_with_idle": fds_idle,
            "new_client_answered_from": answered, "refusal_log_lines": logged}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", default=".", help="the checkout the router runs from")
    ap.add_argument("--seconds", type=float, default=30.0, help="flood duration")
    ap.add_argument("--idle", type=int, default=2000, help="idle connections")
    ap.add_argument("--only", choices=["flood", "liar", "connections"], default=None)
    ap.add_argument("--log-dir", default="/tmp", help="router logs go here")
    args = ap.parse_args()
    results = {}
    for name in ("flood", "liar", "connections"):
        if args.only not in (None, name):
            continue
        r = RouterProcess(args.src, Path(args.log_dir) / f"peer_bounds_{name}.log")
        try:
            if name == "flood":
                results[name] = flood(r, args.seconds)
            elif name == "liar":
                results[name] = liar(r)
            else:
                results[name] = connections(r, args.idle)
        finally:
            r.stop()
        print(json.dumps({name: results[name]}), flush=True)


if __name__ == "__main__":
    main()
