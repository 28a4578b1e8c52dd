"""One router in front of N live null workers (``python -m studies.router_overhead
--workers N``).

N null workers (one process, one DEALER each) register, heartbeat every
HEARTBEAT_S with their in-flight rows and a cache report, and answer each
Assign at once (a token and its Done in one frame). A client keeps ``window``
requests of ``max_tokens=1`` in flight. Measured, with the router in its own
process: routed requests/s, the router's CPU (share of one core) while
routing, its RSS, its CPU with the N workers idle, and the time of a
``status`` reply. Decision times (p50/p99) are timed in process on a core
with N registered workers (studies/router_state.py), the router's own code.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import time
from typing import Any

import msgpack
import psutil
import zmq

from studies import null_peers
from studies.router_overhead import _drive, _processes, _run_router, _submit, _warm
from tandem.common import protocol as p
from tandem.launcher.cluster import free_tcp_address

HEARTBEAT_S = null_peers.HEARTBEAT_S
# A worker not yet welcomed sends Ready again, backing off to 5 s (workers/io.py): a
# fleet of 1,024 all resending every heartbeat would bury the router in registrations.
RETRY_S = 5.0


def _worker_socket(ctx: zmq.Context, address: str, wid: str, spec: dict[str, Any]) -> zmq.Socket:
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.SNDHWM, 0)
    s.setsockopt(zmq.IDENTITY, wid.encode())
    s.connect(address)
    s.send(p.encode(null_peers.ready(wid, spec, with_spec=False)))
    return s


def _answer(s: zmq.Socket, wid: str, msg: dict[str, Any], spec: dict[str, Any]) -> bool:
    """Answer one router message; True when it was a Welcome."""
    with_spec = null_peers._resend(msg)
    if with_spec is not None:
        s.send(p.encode(null_peers.ready(wid, spec, with_spec=with_spec)))
        return False
    out = []
    for m in msg["messages"] if msg.get("type") == "batch" else [msg]:
        if m.get("type") == "assign":
            rid = m["request_id"]
            stats = p.DoneStats(output_tokens=1, prompt_tokens=len(m["tokens"]), cached_tokens=0)
            out += [p.TokenDelta(rid, [7], "x"), p.Done(rid, p.FinishReason.LENGTH, stats)]
    if out:
        s.send(p.encode_batch(out))
    return msg.get("type") == "welcome"


def fleet(address: str, n: int, spec: dict[str, Any], stop: Any) -> None:
    """``n`` null workers that answer at once and heartbeat every HEARTBEAT_S."""
    ctx: zmq.Context = zmq.Context()
    ctx.set(zmq.MAX_SOCKETS, n + 64)  # the default allows 1,023
    ids = [f"fleet-{i}" for i in range(n)]
    socks = [_worker_socket(ctx, address, wid, spec) for wid in ids]
    poller = zmq.Poller()
    for s in socks:
        poller.register(s, zmq.POLLIN)
    index = {s: i for i, s in enumerate(socks)}
    welcomed, seq = [False] * n, [0] * n
    due = [time.monotonic() + HEARTBEAT_S * i / n for i in range(n)]
    turn = 0
    retry_at = [time.monotonic() + RETRY_S] * n
    while not stop.is_set():
        for s, _ in poller.poll(10):
            i = index[s]
            for _ in range(64):
                try:
                    msg = msgpack.unpackb(s.recv(zmq.NOBLOCK))
                except zmq.Again:
                    break
                welcomed[i] = _answer(s, ids[i], msg, spec) or welcomed[i]
        now = time.monotonic()
        # Due in turn (evenly spaced, one period): only the ones due are visited.
        while due[turn] <= now:
            i, turn = turn, (turn + 1) % n
            due[i] = max(due[i] + HEARTBEAT_S, now)
            if not welcomed[i]:  # Ready again at most every RETRY_S, as a worker backs off
                if now >= retry_at[i]:
                    retry_at[i] = now + RETRY_S
                    socks[i].send(p.encode(null_peers.ready(ids[i], spec, with_spec=False)))
                continue
            if seq[i] == 0:  # a full listing of one block, then "nothing changed"
                seq[i], cache = 1, p.CacheReport(full=True, seq=1, blocks=[i + 1])
            else:
                seq[i], cache = 2, p.CacheReport(full=False, base=1, seq=1)
            socks[i].send(p.encode(p.Heartbeat(ids[i], seq[i], [], [], 0, 1 << 20, cache)))
    for s in socks:
        s.close(0)
    ctx.term()


def status_ms(sock: zmq.Socket, n: int = 5) -> tuple[float, int]:
    """Median round trip of a status query, and how many workers it listed."""
    times, seen = [], 0
    for _ in range(n):
        t0 = time.perf_counter()
        sock.send(p.encode(p.StatusQuery()))
        while True:
            if not sock.poll(30_000):
                raise RuntimeError("no status reply")
            reply = msgpack.unpackb(sock.recv())
            if reply.get("type") == "status_reply":
                break
        times.append(time.perf_counter() - t0)
        seen = len(reply.get("workers", []))
    return statistics.median(times) * 1e3, seen


def _wait_fleet(sock: zmq.Socket, n: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if status_ms(sock, 1)[1] >= n:
            return
        time.sleep(0.5)
    raise RuntimeError(f"fewer than {n} workers registered in {timeout_s:.0f} s")


def _cpu_s(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def measure_fleet(n: int, requests: int = 4000, window: int = 256, idle_s: float = 5.0,
                  decisions: int = 300) -> dict[str, float]:  # fmt: skip
    """One router start in front of ``n`` null workers: the numbers the module names."""
    from studies.router_state import loaded_router, time_decision

    c, w = free_tcp_address(), free_tcp_address()
    spec = null_peers.tiny_spec()
    with _processes((_run_router, (c, w)), (fleet, (w, n, spec))) as procs:
        router = psutil.Process(procs[0].pid)
        sock: zmq.Socket = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(c)
        try:
            _warm(sock, procs=procs)
            _wait_fleet(sock, n, timeout_s=60.0 + n / 10)
            time.sleep(2 * HEARTBEAT_S)  # every worker has heartbeated since
            cpu0, t0 = _cpu_s(router), time.monotonic()
            time.sleep(idle_s)
            idle = (_cpu_s(router) - cpu0) / (time.monotonic() - t0)
            st_ms, _ = status_ms(sock)
            frames = [_submit(f"q{i}", 1) for i in range(requests)]
            cpu0 = _cpu_s(router)
            secs, _, _ = _drive(sock, frames, window)
            busy = (_cpu_s(router) - cpu0) / secs
            rss_mb = router.memory_info().rss / 2**20
        finally:
            sock.close(0)
    core = loaded_router(n, random.Random(n))
    ts = sorted(time_decision(core, i) for i in range(decisions))
    return {
        "workers": n, "req_s": requests / secs, "router_cpu_pct": 100 * busy,
        # What a whole core would route at this cost: the load-robust number on a
        # shared machine, where the router gets what the others leave it.
        "req_per_cpu_s": requests / max(1e-9, busy * secs),
        "idle_cpu_pct": 100 * idle, "rss_mb": rss_mb, "status_ms": st_ms,
        "decision_p50_ms": ts[len(ts) // 2] * 1e3, "decision_p99_ms": ts[int(0.99 * len(ts))] * 1e3,
    }  # fmt: skip


def run_fleet(sizes: list[int], runs: int, requests: int, progress: Any = print) -> dict[str, Any]:
    """``runs`` router starts per fleet size, sizes interleaved (run 1 of every size,
    then run 2, ...) so that a change in the machine's load spreads over all of them;
    medians per size, with the load average at each start."""
    from tandem.common.fdlimit import raise_fd_limit

    raise_fd_limit()  # a DEALER per null worker, in the processes this one starts
    by_size: dict[int, list[dict[str, float]]] = {n: [] for n in sizes}
    for r in range(runs):
        for n in sizes:
            got = measure_fleet(n, requests) | {"load_avg": os.getloadavg()[0]}
            progress(f"run {r + 1}/{runs} workers {n}: " + json.dumps(_rounded(got)))
            by_size[n].append(got)
    summary = {
        n: {k: round(statistics.median(x[k] for x in got), 3) for k in got[0]}
        for n, got in by_size.items()
    }
    return {"runs": {str(n): got for n, got in by_size.items()}, "summary": summary}


def _rounded(d: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 3) for k, v in d.items()}


def plot_fleet(curves: dict[str, dict[int, dict[str, float]]], path: str) -> None:
    """Routed req per router CPU-second and ``status`` time by fleet size, one line
    per curve (``{label: summary}``, a summary as ``run_fleet`` gives it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.4))
    for label, summary in curves.items():
        sizes = sorted(int(n) for n in summary)
        rows = [summary[n] for n in sizes]
        left.plot(sizes, [r["req_per_cpu_s"] for r in rows], marker="o", label=label)
        right.plot(sizes, [r["status_ms"] for r in rows], marker="o", label=label)
    left.set(xscale="log", xlabel="live workers", ylabel="routed req per router CPU-s")
    right.set(xscale="log", yscale="log", xlabel="live workers", ylabel="status reply (ms)")
    left.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
