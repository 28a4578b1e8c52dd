"""Issue 28, items 3-6, measured the same way on two trees: malformed bodies, a
slowloris flood under a 1,024-descriptor limit, and clients whose keys are refused.

Uses only what both trees have (Cluster, the clients, raw sockets), so the one file
runs on either. One JSON line per scenario on stdout. Run from a tree's root:
python studies/gateway_guard.py (docs/results/reliability.md has both trees' lines).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from tandem.common.auth import make_keys
from tandem.launcher.cluster import Cluster, WorkerSpec

SIM = ["--backend", "sim", "--warmup", "off", "--heartbeat-s", "0.2", "--profile", "gpu-m2"]
MSGS = [{"role": "user", "content": "hi"}]
BODIES = {
    "lone surrogate in a prompt": ("/v1/completions", json.dumps({"prompt": "\udcff"}).encode()),
    "lone surrogate in a message": (
        "/v1/chat/completions",
        json.dumps({"messages": [{"role": "user", "content": "a\udcff"}]}).encode(),
    ),  # noqa: E501
    "JSON 100k deep": ("/v1/chat/completions", b"[" * 100_000 + b"]" * 100_000),
    "token id 2^64": ("/v1/completions", json.dumps({"prompt": [1, 2**64]}).encode()),
    "max_tokens 2^64": (
        "/v1/completions",
        json.dumps({"prompt": "a", "max_tokens": 2**64}).encode(),
    ),  # noqa: E501
    "seed 2^64": ("/v1/chat/completions", json.dumps({"messages": MSGS, "seed": 2**64}).encode()),
    "top_k 2^64": ("/v1/chat/completions", json.dumps({"messages": MSGS, "top_k": 2**64}).encode()),
    "top_k a string": (
        "/v1/chat/completions",
        json.dumps({"messages": MSGS, "top_k": "4"}).encode(),
    ),  # noqa: E501
}


def record(scenario: str, **fields: object) -> None:
    print(json.dumps({"scenario": scenario, **fields}), flush=True)


def status_of(url: str, body: bytes | None = None, source: str = "127.0.0.1") -> int:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10, source_address=(source, 0))
    try:
        conn.request("GET" if body is None else "POST", "/v1/models" if body is None else "", body)
        return conn.getresponse().status
    except OSError:
        return 0  # refused or reset
    finally:
        conn.close()


def bad_bodies(c: Cluster, url: str) -> None:
    answers = {}
    for name, (path, body) in BODIES.items():
        req = urllib.request.Request(url + path, data=body, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                answers[name] = r.status
        except urllib.error.HTTPError as e:
            answers[name] = e.code
    record("malformed bodies", statuses=answers, http_500=sum(s >= 500 for s in answers.values()))


def slowloris(c: Cluster, url: str, n: int = 1100, window_s: float = 20.0) -> None:
    """n connections trickling header lines, the gateway limited to 1,024 descriptors;
    a normal request every 0.5 s from another address (127.0.0.2) meanwhile."""
    resource.prlimit(c.procs["gateway"].pid, resource.RLIMIT_NOFILE, (1024, 1024))
    host, port = url.removeprefix("http://").split(":")
    socks = []
    for _ in range(n):
        try:
            s = socket.create_connection((host, int(port)), timeout=5)
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
            s.setblocking(False)
            socks.append(s)
        except OSError:
            pass
    t0, normal, open_at_end = time.monotonic(), [], 0
    while time.monotonic() - t0 < window_s:
        for s in socks:
            with contextlib.suppress(OSError):
                s.send(b"X-Pad: y\r\n")
        normal.append(status_of(url, source="127.0.0.2"))
        time.sleep(0.5)
    for s in socks:
        try:
            s.send(b"X-Pad: y\r\n")
            open_at_end += s.recv(1) != b""
        except BlockingIOError:
            open_at_end += 1
        except OSError:
            pass
        s.close()
    record(
        f"slowloris: {n} trickling connections, gateway at 1,024 descriptors",
        connected=len(socks),
        normal_requests=len(normal),
        normal_200=normal.count(200),
        still_open_after_s=[round(window_s), open_at_end],
    )


PROBE = """
import asyncio, sys, time
from tandem.client import AsyncClient, Client
addr, keys, kind = sys.argv[1], sys.argv[2] or None, sys.argv[3]
t0 = time.monotonic()
try:
    if kind == "sync":
        c = Client(addr, timeout_s=10, connect_timeout_s=10, retries=0, keys=keys)
        time.sleep(0.5)
        c.generate("hi", max_tokens=2)
    else:
        async def run():
            c = AsyncClient(addr, timeout_s=10, keys=keys)
            await asyncio.sleep(0.5)
            await c.status()
        asyncio.run(run())
    print("answered", time.monotonic() - t0 - 0.5)
except Exception as exc:
    print(type(exc).__name__, round(time.monotonic() - t0 - 0.5, 2))
"""


def refused(tmp: Path) -> None:
    make_keys(tmp / "keys")
    make_keys(tmp / "other")
    stranger = tmp / "stranger"
    stranger.mkdir()
    shutil.copy(tmp / "keys" / "router.key", stranger)
    shutil.copy(tmp / "other" / "client.key_secret", stranger)
    with Cluster(workers=[WorkerSpec("w", SIM)], keys=str(tmp / "keys")) as c:
        out = {}
        for keys_name, keys in (("no keys", ""), ("unknown key", str(stranger))):
            for kind in ("sync", "async"):
                try:
                    run = subprocess.run([sys.executable, "-c", PROBE, c.client_addr, keys, kind],
                                         capture_output=True, text=True, timeout=40)  # fmt: skip
                    out[f"{keys_name}, {kind}"] = run.stdout.strip() or run.stderr[-200:]
                except subprocess.TimeoutExpired:
                    out[f"{keys_name}, {kind}"] = "silent after 40 s"
        record("client refused by the router (timeouts 10 s)", outcomes=out)


def main() -> None:
    with Cluster(workers=[WorkerSpec("w", SIM)]) as c:
        url = c.start_gateway()
        bad_bodies(c, url)
        slowloris(c, url)
    with tempfile.TemporaryDirectory() as tmp:
        refused(Path(tmp))


if __name__ == "__main__":
    threading.excepthook = lambda args: None
    main()
