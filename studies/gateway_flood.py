"""Issue 38, item 3: does /health answer within 50 ms while 20 bodies of 123k tiny
chat messages (4 MiB each) arrive at once?

A router with one sim worker and the gateway with its defaults, on loopback. /health
is polled every 20 ms from its own thread (a fresh connection each, as a load
balancer's probe) through a quiet spell, ``--rounds`` floods of ``--bodies`` POSTs
sent together from another process at the lowest priority, and another quiet spell.
Beside the flood, in the same run, a control: bodies of the same size whose one
message holds all the text (as many bytes to carry, little to parse). Printed: one
JSON line with /health's latencies (quiet and under each flood), the answers, and
the gateway's and router's peak RSS. Uses only what the tree before the change has
too (Cluster, the CLI), so the one file measures both: run it from a tree's root,
or from a folder where ``tandem`` is the other tree (docs/results/reliability.md).

    python studies/gateway_flood.py [--bodies 20] [--messages 123000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import threading
import time

from tandem.launcher.cluster import Cluster, WorkerSpec, free_tcp_address

SIM = ["--backend", "sim", "--warmup", "off", "--heartbeat-s", "0.2", "--profile", "gpu-m2"]
POLL_S = 0.02
QUIET_S = 2.0
GAP_S = 1.0


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return kb / 1024


def http_call(port: int, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


class Poller(threading.Thread):
    """/health every POLL_S: (time sent, seconds to answer, status), and peak RSS."""

    def __init__(self, port: int, pids: dict[str, int]) -> None:
        super().__init__(daemon=True)
        self.port, self.pids = port, pids
        self.samples: list[tuple[float, float, int]] = []
        self.peak_mb = {name: 0.0 for name in pids}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            t0 = time.monotonic()
            try:
                status, _ = http_call(self.port, "GET", "/health")
            except OSError:
                status = 0
            self.samples.append((t0, time.monotonic() - t0, status))
            for name, pid in self.pids.items():
                self.peak_mb[name] = max(self.peak_mb[name], rss_mb(pid))
            time.sleep(max(0.0, POLL_S - (time.monotonic() - t0)))


def flood(port: int, body: bytes, n: int) -> list[tuple[int, float, str]]:
    """``n`` POSTs of ``body`` at once, from another process at the lowest priority
    (so that its threads do not slow the poller's, nor take the cores the gateway
    needs): (status, seconds, the error's message)."""
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()

    def senders() -> None:
        os.nice(19)  # the box has 2 cores: the senders must not starve what is measured
        results.put(_flood(port, body, n))

    proc = ctx.Process(target=senders)
    proc.start()
    out = results.get()
    proc.join()
    return out


def _flood(port: int, body: bytes, n: int) -> list[tuple[int, float, str]]:
    out: list[tuple[int, float, str]] = [(0, 0.0, "")] * n
    start = threading.Barrier(n)

    def one(i: int) -> None:
        start.wait()
        t0 = time.monotonic()
        status, raw = http_call(port, "POST", "/v1/chat/completions", body)
        try:
            words = json.loads(raw).get("error", {}).get("message", "")
        except ValueError:
            words = raw[:80].decode(errors="replace")
        out[i] = (status, time.monotonic() - t0, words[:100])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def latencies_ms(
    samples: list[tuple[float, float, int]], spells: list[tuple[float, float]]
) -> dict:
    """/health's answers to the probes sent within ``spells`` ((start, end) pairs)."""
    inside = [s for s in samples if any(lo <= s[0] < hi for lo, hi in spells)]
    got = sorted(s[1] * 1000 for s in inside)
    if not got:
        return {"n": 0}
    return {
        "n": len(got),
        "p50_ms": round(statistics.median(got), 1),
        "p99_ms": round(got[min(len(got) - 1, int(len(got) * 0.99))], 1),
        "max_ms": round(got[-1], 1),
        "over_50ms": sum(x > 50 for x in got),
        "non_200": sum(s[2] != 200 for s in inside),
    }


def measure(port: int, pids: dict[str, int], body: bytes, n: int, rounds: int) -> dict:
    """/health polled through a quiet spell, ``rounds`` floods of ``n`` POSTs of
    ``body`` at once (GAP_S apart), and another quiet spell."""
    poller = Poller(port, pids)
    poller.start()
    time.sleep(QUIET_S)
    spells, answers = [], []
    for _ in range(rounds):  # a flood is over in a fraction of a second: several
        t_flood = time.monotonic()
        answers += flood(port, body, n)
        spells.append((t_flood, time.monotonic()))
        time.sleep(GAP_S)
    time.sleep(QUIET_S)
    poller.stop.set()
    poller.join()
    statuses: dict[str, int] = {}
    for status, _, _ in answers:
        statuses[str(status)] = statuses.get(str(status), 0) + 1
    return {
        "body_bytes": len(body),
        "health_quiet": latencies_ms(poller.samples, [(0, spells[0][0])]),
        "health_flood": latencies_ms(poller.samples, spells),
        "flood_s": [round(b - a, 2) for a, b in spells],
        "answers": statuses,
        "slowest_answer_s": round(max(a[1] for a in answers), 2),
        "answer": answers[0][2],
        "peak_rss_mb": {k: round(v) for k, v in poller.peak_mb.items()},
    }


def bodies(messages: int) -> dict[str, bytes]:
    """The flood's body, and a control of the same size whose one message holds all
    its text (as many bytes to carry, next to nothing to parse)."""
    tiny = [{"role": "user", "content": "a"}] * messages
    body = json.dumps({"messages": tiny, "max_tokens": 4}, separators=(",", ":")).encode()
    one = [{"role": "user", "content": "a" * (len(body) - 60)}]
    control = json.dumps({"messages": one, "max_tokens": 4}, separators=(",", ":")).encode()
    return {"control_one_message": control, "tiny_messages": body}


def wait_for_health(port: int) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            if http_call(port, "GET", "/health")[0] == 200:
                return
        except OSError:
            pass
        assert time.monotonic() < deadline, "the gateway did not come up"
        time.sleep(0.2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bodies", type=int, default=20)
    ap.add_argument("--messages", type=int, default=123_000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    port = int(free_tcp_address().rsplit(":", 1)[1])
    report: dict = {"bodies": args.bodies, "messages": args.messages}
    with Cluster(workers=[WorkerSpec("w0", SIM)], transport="tcp") as cl:
        gateway = subprocess.Popen(
            [sys.executable, "-m", "tandem", "gateway", "--router", cl.client_addr,
             "--port", str(port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            wait_for_health(port)
            pids = {"gateway": gateway.pid, "router": cl.procs["router"].pid}
            for name, body in bodies(args.messages).items():
                report[name] = measure(port, pids, body, args.bodies, args.rounds)
        finally:
            gateway.terminate()
            gateway.wait(30)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
