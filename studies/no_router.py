"""How long each way in says "no router at ADDRESS" when nothing listens there (issue
30): the CLI commands as processes (interpreter start included: ``tandem --version``
is timed beside them for that share), the client library's calls, and the gateway's
/health and a chat request. One JSON line per case on stdout, seconds per repeat.

Run from the tree's root: python studies/no_router.py [REPEATS]
"""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from functools import partial

from tandem.client import AsyncClient, Client, TandemError
from tandem.launcher.cluster import Cluster, free_tcp_address

CHAT = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()


def timed(fn: Callable[[], object], repeats: int) -> tuple[list[float], str]:
    seconds, said = [], ""
    for _ in range(repeats):
        t0 = time.monotonic()
        said = str(fn())
        seconds.append(round(time.monotonic() - t0, 3))
    return seconds, said[-160:]


def record(case: str, seconds: list[float], said: str) -> None:
    doc = {"case": case, "median_s": statistics.median(seconds), "max_s": max(seconds),
           "seconds": seconds, "said": said}  # fmt: skip
    print(json.dumps(doc), flush=True)


def cli(*args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "tandem", *args], capture_output=True, text=True)
    return f"rc {out.returncode}: {out.stderr.strip() or out.stdout.strip()}"


def library(call: Callable[[Client], object], address: str) -> str:
    with Client(address) as c:
        try:
            call(c)
        except TandemError as exc:
            return f"{type(exc).__name__}: {exc.message}"
    return "answered"


def async_status(address: str) -> str:
    async def run() -> str:
        async with AsyncClient(address) as c:
            try:
                await c.status()
            except TandemError as exc:
                return f"{type(exc).__name__}: {exc.message}"
        return "answered"

    return asyncio.run(run())


def http(url: str, body: bytes | None = None) -> str:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=60) as r:
            return f"{r.status}: {r.read().decode()}"
    except urllib.error.HTTPError as e:
        return f"{e.code}: {e.read().decode()}"


def main(repeats: int) -> None:
    address = free_tcp_address()
    record("tandem --version (interpreter start)", *timed(lambda: cli("--version"), repeats))
    for args in (["status"], ["generate", "hi"], ["top", "--once"]):
        label = f"tandem {' '.join(args)}"
        record(label, *timed(partial(cli, *args, "--router", address), repeats))
    for name, call in (("status", Client.status), ("generate", lambda c: c.generate("hi"))):
        record(f"Client.{name}", *timed(partial(library, call, address), repeats))
    record("AsyncClient.status", *timed(lambda: async_status(address), repeats))
    cl = Cluster(transport="tcp")  # never started: the gateway faces no router
    try:
        url = cl.start_gateway()
        record("gateway /health", *timed(lambda: http(f"{url}/health"), repeats))
        chat = f"{url}/v1/chat/completions"
        record("gateway chat completion", *timed(lambda: http(chat, CHAT), repeats))
    finally:
        cl.__exit__()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
