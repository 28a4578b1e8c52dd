"""What does `tandem serve --ray` cost and give on a local Ray cluster of a head and
two nodes (sim workers, cpu-m2 profile)? Time to ready, the time with no service
after the router's process, actor or node is lost, and requests/s with 3 nodes
against 1, measured side by side in one run (3, 1, 3 nodes).

    unshare -n bash -c 'ip link set lo up && .venv/bin/python -m studies.fleet.measure'

(root; inside a network namespace with only loopback up, as the tests run).
Prints one JSON document; docs/DEPLOY.md quotes it.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from tests.fleet.harness import NO_SERVICE, LocalRay, Serve, chat

BURST, MAX_TOKENS, CONCURRENCY = 96, 32, 24


def _access(address: str) -> Any:
    from tandem.client import Client
    from tandem.fleet.access import router_access

    def client() -> Client:
        addr, keys, cleanup = router_access(address)
        try:  # the client reads its keys once, as it is made
            return Client(addr, keys=str(keys), timeout_s=120)
        finally:
            cleanup()

    return client


def _workers(address: str) -> int:
    from tandem.client import TandemError

    try:
        with _access(address)() as c:
            return len(c.status().workers)
    except TandemError:
        return 0


def _wait_workers(address: str, n: int) -> None:
    deadline = time.monotonic() + 90
    while _workers(address) != n:
        assert time.monotonic() < deadline, f"not {n} workers"
        time.sleep(0.5)


def _burst(address: str) -> float:
    """Requests/s for BURST requests, CONCURRENCY at a time, through the router."""
    client = _access(address)
    todo = list(range(BURST))
    lock = threading.Lock()

    def run() -> None:
        with client() as c:
            while True:
                with lock:
                    if not todo:
                        return
                    n = todo.pop()
                r = c.generate(f"request {n}", max_tokens=MAX_TOKENS)
                assert len(r.token_ids) == MAX_TOKENS

    start = time.monotonic()
    threads = [threading.Thread(target=run) for _ in range(CONCURRENCY)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return BURST / (time.monotonic() - start)


def _downtime(url: str, since: float) -> float:
    while True:
        try:
            chat(url, "Back?", max_tokens=4, timeout_s=5)
            return time.monotonic() - since
        except NO_SERVICE:
            time.sleep(0.05)


def _serve(local: LocalRay, out: dict[str, Any]) -> tuple[Serve, str]:
    log = Path(tempfile.mkdtemp()) / "serve.log"
    t0 = time.monotonic()
    serve = Serve(local.address, log=log)
    serve.wait_for("ready:", 120)
    out.setdefault("serve_ready_s", []).append(round(time.monotonic() - t0, 1))
    _wait_workers(local.address, 3)
    return serve, f"http://127.0.0.1:{serve.port}"


def main() -> None:
    import ray

    from tandem.fleet import NAMESPACE

    out: dict[str, Any] = {}
    t0 = time.monotonic()
    local = LocalRay(nodes=2)  # the router on the head: the 1-node phase keeps it
    out["cluster_start_s"] = round(time.monotonic() - t0, 1)
    ray.init(address=local.address, namespace=NAMESPACE, log_to_driver=False)
    serve, url = _serve(local, out)
    try:
        rates: dict[str, list[float]] = {"3": [], "1": []}
        _burst(local.address)  # warm: every worker's first requests, the clients' imports
        rates["3"].append(_burst(local.address))
        for node in local.nodes:
            local.remove(node)
        local.nodes = []
        _wait_workers(local.address, 1)
        rates["1"].append(_burst(local.address))
        local.nodes = [local.add(router=True) for _ in range(2)]
        _wait_workers(local.address, 3)
        rates["3"].append(_burst(local.address))
        out["requests_per_s"] = {k: [round(x, 2) for x in v] for k, v in rates.items()}
        out["ratio_3_to_1"] = round(statistics.mean(rates["3"]) / rates["1"][0], 2)
        down: dict[str, list[float]] = {"process": [], "actor": [], "node": []}
        router = ray.get_actor("router")
        for _ in range(3):
            pid = ray.get(router.router_pid.remote())
            since = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            down["process"].append(round(_downtime(url, since), 2))
            _wait_workers(local.address, 3)
        for _ in range(3):
            since = time.monotonic()
            ray.kill(router, no_restart=False)
            down["actor"].append(round(_downtime(url, since), 2))
            _wait_workers(local.address, 3)
        serve.stop()
        # Now two nodes offer tandem-router: a new fleet puts its router on one.
        serve, url = _serve(local, out)
        router = ray.get_actor("router")
        for _ in range(2):
            host = ray.get(router.address.remote()).node_id
            (node,) = [n for n in local.nodes if n.node_id == host]
            local.nodes.append(local.add(router=True))
            _wait_workers(local.address, 4)
            since = time.monotonic()
            local.remove(node)
            local.nodes.remove(node)
            down["node"].append(round(_downtime(url, since), 2))
            _wait_workers(local.address, 3)
        out["downtime_s"] = down
        out["load_avg"] = os.getloadavg()
    finally:
        serve.stop()
        ray.shutdown()
        local.shutdown()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
