"""tandem serve --ray on a local Ray cluster (a head and two nodes, one offering
`tandem-router`; sim workers), driven as a user would: every node serves, a node
added serves, a node removed mid-stream has its streams finish elsewhere, the router
killed comes back with no client given another's tokens, Ctrl-C leaves nothing.

One cluster for the module; the tests run in order, each from the state the one
before left. Run by test_namespace.py inside a private network namespace."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import psutil
import pytest

from tandem.client import Client, TandemError
from tests.fleet.harness import NO_SERVICE, LocalRay, Serve, chat

JOIN_S = 30.0  # the bound: a node that joins serves within it


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory):
    import ray

    from tandem.fleet import NAMESPACE

    local = LocalRay(nodes=2, router_on=(0,))
    log = tmp_path_factory.mktemp("fleet") / "serve.log"
    # Port 0: the router takes free ports at each start of its actor, so a restart
    # moves it and the workers must be re-pointed (the path a node's loss takes).
    serve = Serve(local.address, "--set", "router.client_addr='tcp://127.0.0.1:0'",
                  "--set", "router.worker_addr='tcp://127.0.0.1:0'", log=log)  # fmt: skip
    ray.init(address=local.address, namespace=NAMESPACE, log_to_driver=False)
    try:
        serve.wait_for("ready:", 120)
        yield Fleet(local, serve)
    finally:
        serve.stop()
        ray.shutdown()
        local.shutdown()


class Fleet:
    def __init__(self, local: LocalRay, serve: Serve) -> None:
        self.local, self.serve = local, serve
        self.url = f"http://127.0.0.1:{serve.port}"
        self.pids: set[int] = set()

    def router(self) -> Any:
        import ray

        return ray.get_actor("router")

    def client(self, timeout_s: float = 60.0) -> Client:
        from tandem.fleet.access import router_access

        addr, keys, cleanup = router_access(self.local.address)
        try:  # the client reads its keys once, as it is made
            return Client(addr, keys=str(keys), timeout_s=timeout_s, connect_timeout_s=2.0)
        finally:
            cleanup()

    def workers(self) -> dict[str, dict[str, Any]]:
        try:
            with self.client() as c:
                return {str(w["id"]): w for w in c.status().workers}
        except TandemError:
            return {}

    def wait_workers(self, want: int, timeout_s: float) -> dict[str, dict[str, Any]]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            rows = self.workers()
            if len(rows) == want:
                return rows
            time.sleep(0.5)
        raise AssertionError(f"{want} workers not registered in {timeout_s} s: {sorted(rows)}")

    def note_pids(self) -> None:
        """Every pid the fleet's actors run now, to check that Ctrl-C ends them."""
        import ray

        for actor in ray.util.list_named_actors(all_namespaces=False):
            handle = ray.get_actor(actor)
            self.pids |= {p["pid"] for p in ray.get(handle.processes.remote()) if p["pid"]}


def node_id(node: Any) -> str:
    return str(node.node_id)


def short(nid: str) -> str:
    return nid[:8]


def test_every_node_serves(fleet: Fleet) -> None:
    rows = fleet.wait_workers(3, 30)
    nodes = {short(node_id(n)) for n in [fleet.local.cluster.head_node, *fleet.local.nodes]}
    assert {w.split("-")[0] for w in rows} == nodes  # a CPU worker on each node
    with fleet.client() as c:
        for wid in rows:  # pinned: each node's worker answers
            result = c.generate("Hello there", max_tokens=8, worker=wid)
            assert result.worker == wid and len(result.token_ids) == 8
    answer = chat(fleet.url, "Say hello.", max_tokens=8)
    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens"] == 8


def test_status_and_top_find_the_router_through_ray(fleet: Fleet) -> None:
    tandem = [sys.executable, "-m", "tandem"]
    out = subprocess.run([*tandem, "status", "--ray", fleet.local.address, "--json"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    ids = {w["id"] for w in json.loads(out.stdout)["workers"]}
    assert ids == set(fleet.workers())
    top = subprocess.run([*tandem, "top", "--ray", fleet.local.address, "--once"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert top.returncode == 0, top.stderr
    assert all(w in top.stdout for w in ids)


def test_a_nodes_logs_reach_the_head(fleet: Fleet) -> None:
    import ray

    nid = node_id(fleet.local.nodes[-1])
    agent = ray.get_actor(f"node-{nid}")
    (row,) = ray.get(agent.processes.remote())
    assert row["name"] == f"{short(nid)}-cpu0" and row["alive"]
    text = ray.get(agent.tail.remote(row["name"], 200))
    assert "tandem worker " in text and f"--worker-id {row['name']}" in text
    assert "registered with router" in text


def test_a_node_that_joins_serves(fleet: Fleet) -> None:
    node = fleet.local.add()
    fleet.local.nodes.append(node)
    start = time.monotonic()
    rows = fleet.wait_workers(4, JOIN_S + 30)
    print(f"a joining node's worker registered {time.monotonic() - start:.1f} s after it joined")
    (new,) = [w for w in rows if w.startswith(short(node_id(node)))]
    fleet.serve.wait_for(f"{short(node_id(node))} node joined", 10)
    with fleet.client() as c:
        assert c.generate("Hi", max_tokens=6, worker=new).worker == new


def _stream(fleet: Fleet, max_tokens: int, out: list[Any], started: threading.Event) -> None:
    try:
        with fleet.client(timeout_s=120) as c:
            s = c.stream("Tell me a story.", max_tokens=max_tokens)
            for _ in s:
                started.set()
            out.append(s.result)
    except TandemError as exc:
        out.append(exc)


def test_a_node_removed_mid_stream_its_streams_finish_elsewhere(fleet: Fleet) -> None:
    where = fleet.router().address.remote()
    import ray

    router_node = ray.get(where).node_id
    results: list[Any] = []
    threads, started = [], []
    for _ in range(8):
        ev = threading.Event()
        t = threading.Thread(target=_stream, args=(fleet, 120, results, ev))
        t.start()
        threads.append(t)
        started.append(ev)
    for ev in started:
        assert ev.wait(60)
    # The busiest worker's node goes (not the router's: that is a later test).
    rows = fleet.workers()
    candidates = [n for n in fleet.local.nodes if node_id(n) != router_node]
    victim = max(candidates, key=lambda n: sum(
        r["inflight"] for w, r in rows.items() if w.startswith(short(node_id(n)))))  # fmt: skip
    lost = [w for w in rows if w.startswith(short(node_id(victim)))]
    assert any(rows[w]["inflight"] for w in lost), rows
    fleet.local.remove(victim)
    fleet.local.nodes.remove(victim)
    for t in threads:
        t.join(120)
    assert all(not isinstance(r, Exception) for r in results), results
    assert len(results) == 8
    assert all(r.finish_reason == "length" and len(r.token_ids) == 120 for r in results)
    moved = [r for r in results if set(r.stats.get("rerouted_from") or []) & set(lost)]
    assert moved, [r.stats for r in results]  # those on the lost node continued elsewhere
    assert all(r.worker not in lost for r in moved)
    fleet.serve.wait_for(f"{short(node_id(victim))} node left", 30)
    fleet.wait_workers(3, 30)


def _downtime(fleet: Fleet, since: float, timeout_s: float = 90.0) -> float:
    """Seconds from ``since`` until a request through the gateway succeeds again."""
    deadline = since + timeout_s
    while time.monotonic() < deadline:
        try:
            chat(fleet.url, "Back?", max_tokens=4, timeout_s=5)
            return time.monotonic() - since
        except NO_SERVICE:
            time.sleep(0.05)
    raise AssertionError(f"no service {timeout_s} s after the router went")


def _own_tokens_only(fleet: Fleet) -> None:
    """Concurrent clients, each asking its own length: each gets exactly its own."""
    results: dict[int, Any] = {}

    def one(n: int) -> None:
        with fleet.client() as c:
            results[n] = c.generate(f"client {n}", max_tokens=n, seed=n)

    threads = [threading.Thread(target=one, args=(n,)) for n in range(5, 17)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(results) == list(range(5, 17))
    for n, r in results.items():
        assert r.finish_reason == "length" and len(r.token_ids) == n, (n, r)


def _gateway_stream(fleet: Fleet, out: list[Any]) -> None:
    try:
        out.append(chat(fleet.url, "Tell me a long story.", 200, stream=True, timeout_s=60))
    except NO_SERVICE as exc:
        out.append(exc)


def _wait_in_flight(fleet: Fleet, n: int) -> None:
    deadline = time.monotonic() + 60
    while sum(w["inflight"] for w in fleet.workers().values()) < n:
        assert time.monotonic() < deadline, fleet.workers()
        time.sleep(0.1)


def test_router_process_killed_service_back_no_foreign_tokens(fleet: Fleet) -> None:
    import ray

    pid = ray.get(fleet.router().router_pid.remote())
    results: list[Any] = []
    threads, started = [], []
    for _ in range(4):
        ev = threading.Event()
        threads.append(threading.Thread(target=_stream, args=(fleet, 200, results, ev)))
        threads[-1].start()
        started.append(ev)
    streams: list[Any] = []  # and two through the gateway
    for _ in range(2):
        threads.append(threading.Thread(target=_gateway_stream, args=(fleet, streams)))
        threads[-1].start()
    for ev in started:
        assert ev.wait(60)
    _wait_in_flight(fleet, 6)
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    for t in threads:
        t.join(60)
    # In-flight clients are told (RouterLost), not left waiting nor given others' tokens.
    assert len(results) == 4 and all(isinstance(r, TandemError) for r in results), results
    # Through the gateway: an SSE error event ends each stream, short of its 200 tokens.
    assert len(streams) == 2, streams
    for chunks in streams:
        assert isinstance(chunks, list) and "error" in chunks[-1], chunks[-3:]
        assert all(c.get("choices", [{}])[0].get("finish_reason") is None for c in chunks[:-1])
    print(f"router process killed: service back after {_downtime(fleet, killed):.2f} s")
    fleet.wait_workers(3, 30)
    _own_tokens_only(fleet)


def test_router_actor_killed_ray_restarts_it(fleet: Fleet) -> None:
    import ray

    before = ray.get(fleet.router().address.remote())
    workers = _worker_pids()
    killed = time.monotonic()
    ray.kill(fleet.router(), no_restart=False)
    print(f"router actor killed: service back after {_downtime(fleet, killed):.2f} s")
    after = ray.get(fleet.router().address.remote())
    assert after.incarnation != before.incarnation and after.worker != before.worker
    fleet.wait_workers(3, 60)  # re-pointed at the new address...
    assert _worker_pids() == workers  # ...by the file they follow, not by restarting
    _own_tokens_only(fleet)


def _worker_pids() -> dict[str, int]:
    import ray

    out = {}
    for name in ray.util.list_named_actors():
        if name.startswith("node-"):
            out |= {p["name"]: p["pid"] for p in ray.get(ray.get_actor(name).processes.remote())}
    return out


def test_an_agent_ray_restarts_starts_its_workers_at_the_router_now(fleet: Fleet) -> None:
    """The router moved since the agents were made (the test before): an agent
    whose process dies is made again by Ray from its first arguments, an address
    long gone, and the driver points it at the router's present one."""
    import ray

    victim = fleet.local.nodes[-1]
    agent = ray.get_actor(f"node-{node_id(victim)}")
    old = {w: pid for w, pid in _worker_pids().items() if w.startswith(short(node_id(victim)))}
    ray.kill(agent, no_restart=False)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        rows = fleet.workers()
        now = {w: pid for w, pid in _worker_pids().items() if w in old}
        if len(rows) == 3 and now and all(now[w] != old[w] for w in now):
            break
        time.sleep(0.5)
    # The rows the loop saw: a second status read raced the old worker's expiry once.
    assert len(rows) == 3 and set(now) == set(old), (rows, now, old)
    with fleet.client() as c:
        for wid in old:
            assert c.generate("again", max_tokens=3, worker=wid).worker == wid


def test_router_node_lost_router_moves(fleet: Fleet) -> None:
    import ray

    spare = fleet.local.add(router=True)  # somewhere for the router to go
    fleet.local.nodes.append(spare)
    fleet.wait_workers(4, JOIN_S + 30)
    before = ray.get(fleet.router().address.remote())
    (host,) = [n for n in fleet.local.nodes if node_id(n) == before.node_id]
    killed = time.monotonic()
    fleet.local.remove(host)
    fleet.local.nodes.remove(host)
    print(f"router's node lost: service back after {_downtime(fleet, killed):.2f} s")
    after = ray.get(fleet.router().address.remote())
    assert after.node_id == node_id(spare)
    fleet.wait_workers(3, 60)
    _own_tokens_only(fleet)


def test_ctrl_c_stops_every_process(fleet: Fleet) -> None:
    fleet.note_pids()
    assert fleet.pids
    assert fleet.serve.stop() == 0
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(psutil.pid_exists(p) for p in fleet.pids):
        time.sleep(0.2)
    alive = [p for p in fleet.pids if psutil.pid_exists(p) and
             psutil.Process(p).status() != psutil.STATUS_ZOMBIE]  # fmt: skip
    assert not alive
