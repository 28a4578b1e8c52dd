"""What the router itself costs, against a null worker.

    .venv/bin/python -m studies.router_overhead [--runs 3] [--out overhead.json]
    .venv/bin/python -m studies.router_overhead --workers 64 --workers 1024  # router_fleet.py

Three paths carry the same frames from one client to one null worker
(studies/null_peers.py): ``direct`` (client to worker), ``relay`` (a plain pyzmq
relay: bytes in, bytes out) and ``router`` (tandem's router). Each measures:

- routed requests/s: ``max_tokens=1``, ``window`` requests in flight;
- relayed tokens/s: ``streams`` requests of ``stream_tokens`` tokens at once;
- latency p50/p99 of one request at a time (added latency = router - direct).

Then, in process, the time of one routing decision (a 512-token prompt) at 1 to
1,024 workers, each with requests in flight, a heartbeat and cached blocks; and,
with the router in its own process, its RSS and CPU while ``swarm`` idle workers
carrying the real tokenizer heartbeat every 0.5 s.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import click
import msgpack
import psutil
import zmq

from studies import null_peers
from tandem.cli.options import out_file_option
from tandem.common import protocol as p
from tandem.launcher.cluster import free_tcp_address

SPAWN = mp.get_context("spawn")


@dataclass(frozen=True)
class OverheadConfig:
    requests: int = 4000
    window: int = 256
    streams: int = 64
    stream_tokens: int = 2000
    latency_requests: int = 500
    decision_workers: tuple[int, ...] = (1, 16, 64, 256, 1024)
    swarm: int = 256
    swarm_window_s: float = 10.0

    def __post_init__(self) -> None:
        if min(self.requests, self.window, self.streams, self.stream_tokens) < 1:
            raise ValueError("requests, window, streams and stream_tokens must be >= 1")
        if self.latency_requests < 10 or self.swarm < 1 or self.swarm_window_s <= 0:
            raise ValueError("latency_requests >= 10, swarm >= 1, swarm_window_s > 0")


def _run_router(client: str, worker: str, stop: Any) -> None:
    import logging

    from tandem.broker.router import Router, RouterConfig
    from tandem.common.settings import Addresses

    logging.basicConfig(level=logging.ERROR)
    # The loop tests its stop event every turn: a multiprocessing Event takes a lock
    # each time (~4 % of the router's CPU here), the threading.Event that `tandem
    # router` passes (broker/main.py) does not. Measured: the router as it runs.
    local = threading.Event()

    def relay_stop() -> None:
        stop.wait()
        local.set()

    threading.Thread(target=relay_stop, daemon=True).start()
    Router(RouterConfig(), Addresses(client, worker)).serve(local)


@contextmanager
def _processes(*targets: tuple[Any, tuple[Any, ...]]) -> Iterator[list[Any]]:
    stop = SPAWN.Event()
    procs = [
        SPAWN.Process(target=f, args=(*args, stop), daemon=True, name=f.__name__)
        for f, args in targets
    ]
    for proc in procs:
        proc.start()
    try:
        yield procs
    finally:
        stop.set()
        for proc in procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()


@contextmanager
def path(kind: str) -> Iterator[tuple[zmq.Socket, int | None]]:
    """A client DEALER connected to a null worker through ``kind``."""
    c, w = free_tcp_address(), free_tcp_address()
    targets: list[tuple[Callable[..., None], tuple[str, str]]]
    if kind == "direct":
        targets = [(null_peers.null_worker, (c, "direct"))]
    elif kind == "relay":
        targets = [(null_peers.plain_relay, (c, w)), (null_peers.null_worker, (w, "relay"))]
    else:
        targets = [(_run_router, (c, w)), (null_peers.null_worker, (w, "router"))]
    with _processes(*targets) as procs:
        sock: zmq.Socket = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(c)
        try:
            _warm(sock, procs=procs)
            yield sock, procs[0].pid
        finally:
            sock.close(0)


def _submit(rid: str, max_tokens: int) -> bytes:
    return p.encode(p.Submit(rid, tokens=[1, 2, 3], sampling=p.SamplingParams(max_tokens)))


def _warm(sock: zmq.Socket, timeout_s: float = 30.0, procs: Sequence[Any] = ()) -> None:
    """Retry one request until the whole path answers (processes take time to start);
    one of ``procs`` that exits first fails it at once, naming its exit code."""
    deadline = time.monotonic() + timeout_s
    n = 0
    while time.monotonic() < deadline:
        dead = [proc for proc in procs if not proc.is_alive()]
        if dead:
            codes = ", ".join(f"{proc.name} exited with code {proc.exitcode}" for proc in dead)
            raise RuntimeError(f"the path never answered: {codes}")
        n += 1
        sock.send(_submit(f"warm{n}", 1))
        end = time.monotonic() + 1.0
        while sock.poll(max(1, int((end - time.monotonic()) * 1000))):
            if any(m.get("type") == "done" for m in _messages(sock.recv())):
                while sock.poll(200):
                    sock.recv()
                return
    raise RuntimeError("the path never answered")


def _drive(sock: zmq.Socket, frames: list[bytes], window: int) -> tuple[float, int, list[float]]:
    """Send ``frames`` keeping ``window`` in flight: (seconds, tokens, latencies)."""
    sent_at: dict[str, float] = {}
    latencies: list[float] = []
    tokens = sent = 0
    t0 = time.perf_counter()
    while len(latencies) < len(frames):
        while sent < len(frames) and sent - len(latencies) < window:
            sent_at[f"q{sent}"] = time.perf_counter()
            sock.send(frames[sent])
            sent += 1
        if not sock.poll(10_000):
            raise RuntimeError(f"stalled after {len(latencies)} of {len(frames)} requests")
        while True:
            try:
                frame = sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            for msg in _messages(frame):
                kind = msg.get("type")
                if kind == "tokens":
                    tokens += len(msg["token_ids"])
                elif kind == "step_tokens":  # direct and plain relay: the worker's own frames
                    tokens += sum(map(len, msg["token_ids"]))
                elif kind in ("done", "error"):
                    latencies.append(time.perf_counter() - sent_at.pop(msg["request_id"]))
    return time.perf_counter() - t0, tokens, latencies


def _messages(frame: bytes) -> list[dict[str, Any]]:
    """A frame's message maps: the one it holds, or a batch's (protocol 5)."""
    msg = msgpack.unpackb(frame)
    return msg["messages"] if msg.get("type") == "batch" else [msg]


def _pct(xs: list[float], q: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))]


def measure_path(kind: str, cfg: OverheadConfig) -> dict[str, float]:
    """Requests/s, tokens/s and latency through one path."""
    with path(kind) as (sock, _):
        secs, _, _ = _drive(sock, [_submit(f"q{i}", 1) for i in range(cfg.requests)], cfg.window)
        frames = [_submit(f"q{i}", cfg.stream_tokens) for i in range(cfg.streams)]
        tsecs, tokens, _ = _drive(sock, frames, cfg.streams)
        frames = [_submit(f"q{i}", 1) for i in range(cfg.latency_requests)]
        _, _, lat = _drive(sock, frames, 1)
    return {
        "req_s": cfg.requests / secs,
        "tok_s": tokens / tsecs,
        "p50_ms": statistics.median(lat) * 1e3,
        "p99_ms": _pct(lat, 0.99) * 1e3,
    }


def measure_paths(cfg: OverheadConfig) -> dict[str, dict[str, float]]:
    return {kind: measure_path(kind, cfg) for kind in ("direct", "relay", "router")}


def decision_times_ms(n_workers: int, repeats: int = 30) -> float:
    """Median time of one routing decision (512-token prompt) at ``n_workers``."""
    from studies.router_state import loaded_router, time_decision

    router = loaded_router(n_workers, random.Random(n_workers))
    times = [time_decision(router, i) for i in range(repeats)]
    return statistics.median(times) * 1e3


def measure_swarm(cfg: OverheadConfig) -> dict[str, float]:
    """Router RSS and CPU share with ``cfg.swarm`` idle workers heartbeating."""
    from tandem.common.model_files import default_model_path
    from tandem.common.tokenizer import tokenizer_spec_from_gguf

    spec = tokenizer_spec_from_gguf(default_model_path()).to_wire()
    c, w = free_tcp_address(), free_tcp_address()
    swarm = (null_peers.heartbeat_swarm, (w, cfg.swarm, spec))
    with _processes((_run_router, (c, w)), swarm) as (router, _):
        proc = psutil.Process(router.pid)
        registered = _wait_registered(c, cfg.swarm, timeout_s=120.0)
        rss0 = proc.memory_info().rss
        t = proc.cpu_times()
        cpu0, wall0 = t.user + t.system, time.monotonic()
        time.sleep(cfg.swarm_window_s)
        t = proc.cpu_times()
        cpu = (t.user + t.system - cpu0) / (time.monotonic() - wall0)
        rss_mb = max(rss0, proc.memory_info().rss) / 2**20
        return {"registered": registered, "rss_mb": rss_mb, "cpu_pct": 100 * cpu}


def _wait_registered(address: str, n: int, timeout_s: float) -> int:
    """Ask the router's status until ``n`` workers are registered (or time is up)."""
    sock: zmq.Socket = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    deadline, seen = time.monotonic() + timeout_s, 0
    try:
        while time.monotonic() < deadline and seen < n:
            sock.send(p.encode(p.StatusQuery()))
            if sock.poll(5000):
                reply = msgpack.unpackb(sock.recv())
                seen = len(reply.get("workers", []))
            time.sleep(0.5)
    finally:
        sock.close(0)
    return seen


def load_average() -> float:
    return os.getloadavg()[0]


def run_all(cfg: OverheadConfig, runs: int, progress: Any = print) -> dict[str, Any]:
    """``runs`` repetitions of every measurement, each with the load average at its start."""
    out: dict[str, Any] = {"config": cfg.__dict__ | {"runs": runs}, "runs": []}
    for r in range(runs):
        run: dict[str, Any] = {"load_avg": load_average()}
        run["paths"] = measure_paths(cfg)
        progress(f"run {r + 1}/{runs} paths: {run['paths']}")
        run["decision_ms"] = {n: decision_times_ms(n) for n in cfg.decision_workers}
        progress(f"run {r + 1}/{runs} decisions: {run['decision_ms']}")
        run["swarm"] = measure_swarm(cfg)
        progress(f"run {r + 1}/{runs} swarm: {run['swarm']}")
        out["runs"].append(run)
    out["summary"] = summarize(out["runs"])
    return out


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over runs; ratios taken within each run (the paths ran side by side)."""

    def med(get: Any) -> float:
        return round(statistics.median(get(r) for r in runs), 4)

    paths = {
        k: {m: med(lambda r, k=k, m=m: r["paths"][k][m]) for m in runs[0]["paths"][k]}
        for k in runs[0]["paths"]
    }

    def ratio(a: str, b: str, m: str) -> float:
        return med(lambda r: r["paths"][a][m] / r["paths"][b][m])

    def added(m: str) -> float:
        return med(lambda r: r["paths"]["router"][m] - r["paths"]["direct"][m])

    return {
        "paths": paths,
        "router_vs_relay_req": ratio("router", "relay", "req_s"),
        "router_vs_relay_tok": ratio("router", "relay", "tok_s"),
        "added_p50_ms": added("p50_ms"),
        "added_p99_ms": added("p99_ms"),
        "decision_ms": {n: med(lambda r, n=n: r["decision_ms"][n]) for n in runs[0]["decision_ms"]},
        "swarm": {k: med(lambda r, k=k: r["swarm"][k]) for k in runs[0]["swarm"]},
        "load_avg": [round(r["load_avg"], 2) for r in runs],
    }


@click.command()
@click.option("--runs", type=int, default=3, show_default=True, help="Repetitions (medians).")
@click.option("--requests", type=int, default=4000, show_default=True, help="For req/s.")
@click.option("--stream-tokens", type=int, default=2000, show_default=True,
              help="Tokens per stream (64 streams) for tok/s.")  # fmt: skip
@click.option("--workers", "fleet", multiple=True, type=click.IntRange(1, 4096),
              help="Instead: one router in front of N live null workers, per N "
                   "(studies/router_fleet.py: req/s, decisions, CPU, RSS, status).")  # fmt: skip
@out_file_option(help="Write JSON here.")
def main(
    runs: int, requests: int, stream_tokens: int, fleet: tuple[int, ...], out: str | None
) -> None:
    """The router's own cost against a null worker."""
    import json
    from functools import partial
    from pathlib import Path

    say = partial(click.echo, err=True)
    if fleet:
        from studies.router_fleet import plot_fleet, run_fleet

        doc = run_fleet(list(fleet), runs, requests, say)
        if out:
            plot_fleet({"router": doc["summary"]}, str(Path(out).with_suffix(".png")))
    else:
        try:
            cfg = OverheadConfig(requests=requests, stream_tokens=stream_tokens)
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
        doc = run_all(cfg, runs, progress=say)
    if out:
        Path(out).write_text(json.dumps(doc, indent=1) + "\n")
    click.echo(json.dumps(doc["summary"], indent=1))


if __name__ == "__main__":
    main()
