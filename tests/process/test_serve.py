"""`tandem serve` as a user runs it: up, answers the OpenAI SDK, a SIGKILLed worker
is restarted and serves again, SIGTERM leaves no process; a taken port is a clear
error with nothing started; a child that ignores SIGTERM is killed after the grace."""

from __future__ import annotations

import io
import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import psutil
import pytest
from rich.console import Console

from tandem.common.auth import make_keys
from tandem.common.nodes import default_node
from tandem.launcher.cluster import Cluster, free_tcp_address, free_tcp_port
from tandem.launcher.plan import Plan, Proc
from tandem.launcher.probes import port_problem
from tandem.launcher.screen import Screen
from tandem.launcher.supervisor import Supervisor
from tests.helpers import needs_llama
from tests.unit.test_serve_plan import hub_cache

START_TIMEOUT_S = 240.0  # a loaded 2-core machine; the bound is for hangs, not speed


def free_addresses() -> tuple[int, str, str]:
    """The gateway's port and the router's two addresses, all free now."""
    return free_tcp_port(), free_tcp_address(), free_tcp_address()


def serve_command(port: int, client_addr: str, worker_addr: str) -> list[str]:
    return [sys.executable, "-m", "tandem", "serve", "--port", str(port),
            "--set", f"router.client_addr='{client_addr}'",
            "--set", f"router.worker_addr='{worker_addr}'"]  # fmt: skip


class Watched:
    """A process and its output (stdout and stderr), line by line."""

    def __init__(self, cmd: list[str], env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def expect(self, *words: str, timeout_s: float = START_TIMEOUT_S) -> str:
        """The next line holding every word; fails with all output so far."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                if self.proc.poll() is not None and self.lines.empty():
                    break
                continue
            self.seen.append(line)
            if all(w in line for w in words):
                return line
        pytest.fail(f"no line with {words}; output:\n" + "\n".join(self.seen))


class Served(Watched):
    """A `tandem serve` process and its stdout, line by line."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        self.port, self.client_addr, self.worker_addr = free_addresses()
        super().__init__(serve_command(self.port, self.client_addr, self.worker_addr) + args, env)

    def descendants(self) -> list[psutil.Process]:
        return psutil.Process(self.proc.pid).children(recursive=True)


def gone(procs: list[psutil.Process]) -> list[psutil.Process]:
    """Those of ``procs`` still running (a zombie is not: its parent has yet to reap)."""
    left = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                left.append(p)
        except psutil.NoSuchProcess:
            pass
    return left


@needs_llama
@pytest.mark.model
@pytest.mark.timeout(600)
def test_serve_answers_restarts_a_killed_worker_and_stops_clean(tmp_path, monkeypatch):
    openai = pytest.importorskip("openai")
    # The model by its hub name, from a hub cache that holds it (no network here).
    cache = tmp_path / "hub"
    hub_cache(cache, "org/Smol-GGUF", ["smol-Q4_1.gguf"])
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    args = ["org/Smol-GGUF:Q4_1", "--warmup", "off", "--threads", "1", "--api-key", "sk-test",
            "--run-dir", str(tmp_path / "run")]  # fmt: skip
    s = Served(args, env)
    try:
        gateway_up = s.expect("gateway", "up")
        # The model's id at once, while the worker may still start: its display name.
        base = f"http://127.0.0.1:{s.port}/v1"
        early = openai.OpenAI(base_url=base, api_key="sk-test", max_retries=0, timeout=30)
        assert early.models.list().data[0].id == "org/Smol-GGUF", gateway_up
        ready = s.expect("ready:")
        url = ready.split("ready:")[1].strip()
        assert url == f"http://127.0.0.1:{s.port}/v1"
        curl = s.expect("curl ")
        assert "Authorization: Bearer sk-test" in curl and '"model": "org/Smol-GGUF"' in curl
        client = openai.OpenAI(base_url=url, api_key="sk-test", max_retries=0, timeout=120)
        assert client.models.list().data[0].id == "org/Smol-GGUF"  # the same once ready
        reply = client.chat.completions.create(
            model="org/Smol-GGUF:Q4_1",  # the name it was served by: an alias of the file's
            messages=[{"role": "user", "content": "Name a color."}],
            max_tokens=8,
        )
        assert reply.choices[0].message.content
        wrong = openai.OpenAI(base_url=url, api_key="sk-wrong", max_retries=0, timeout=30)
        with pytest.raises(openai.AuthenticationError):
            wrong.models.list()

        worker = next(p for p in s.descendants() if "--worker-id" in p.cmdline())
        worker.send_signal(signal.SIGKILL)
        s.expect("cpu0", "killed by SIGKILL", "restarting")
        s.expect("cpu0", "registered")
        reply = client.completions.create(model="smol-Q4_1.gguf", prompt="Hi", max_tokens=4)
        assert reply.choices[0].text is not None
        assert (tmp_path / "run" / "cpu0.log").read_text().count("--- ") == 2  # two starts

        children = s.descendants()
        assert len(children) == 3  # router, worker, gateway
        s.proc.send_signal(signal.SIGTERM)
        assert s.proc.wait(timeout=30) == 0
        assert gone(children) == []
        s.expect("stopped (0 processes had to be killed)", timeout_s=5)
    finally:
        if s.proc.poll() is None:
            s.proc.kill()
            psutil.wait_procs(s.descendants(), timeout=5)


def listening_on(port: int) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen()
    return sock


@pytest.mark.parametrize("taken", ["gateway", "router"])
def test_a_taken_port_is_a_clear_error_and_nothing_runs(tmp_path, taken):
    port, client_addr, worker_addr = free_addresses()
    taken_port = port if taken == "gateway" else int(client_addr.rsplit(":", 1)[1])
    with listening_on(taken_port):
        cmd = serve_command(port, client_addr, worker_addr) + ["--run-dir", str(tmp_path)]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    text = out.stdout + out.stderr
    assert f"127.0.0.1:{taken_port}" in text and "in use" in text, text
    # The flag that moves it, to a port free now (not a key to look up).
    move = re.search(
        r"elsewhere: (--port (\d+)|--set router\.client_addr=tcp://127\.0\.0\.1:(\d+))", text
    )
    assert move is not None, text
    moved_to = int(move.group(2) or move.group(3))
    assert moved_to != taken_port
    with listening_on(moved_to):  # free: it binds
        pass
    mine = [p for p in psutil.process_iter(["cmdline"]) if worker_addr in (p.info["cmdline"] or [])]
    assert mine == []


def test_a_second_serve_names_the_router_already_running():
    """The common case of a taken port: tandem serve twice. The reason says a tandem
    router answers there, and one line moves all three addresses."""
    with Cluster(workers=[], transport="tcp") as first:
        plan = Plan((), (), first.client_addr, first.worker_addr, "http://127.0.0.1:0", None)
        problem = port_problem(plan)
    assert problem is not None
    name, reason = problem
    assert name == "router" and f"a tandem router already answers at {first.client_addr}" in reason
    assert "--set router.client_addr=tcp://127.0.0.1:" in reason
    assert "--set router.worker_addr=tcp://127.0.0.1:" in reason


def test_a_child_that_ignores_sigterm_is_killed_with_its_group(tmp_path):
    """The grace ends in SIGKILL for the child's whole process group: the child and
    anything it started."""
    sleeper = "import time; time.sleep(60)"
    stubborn = (
        "import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        f"subprocess.Popen([sys.executable, '-c', {sleeper!r}]); print('up' + 'ok', flush=True); "
        "time.sleep(60)"
    )
    plan = Plan((Proc("router", "router", ("-c", stubborn)),), (), "tcp://x:0", "tcp://y:0",
                "http://127.0.0.1:0", None)  # fmt: skip
    sup = Supervisor(plan, tmp_path, Screen(), "m", grace_s=0.5, prefix=(sys.executable,))
    child = sup.children[0]
    try:
        sup._start(child)
        deadline = time.monotonic() + 20
        while "upok" not in child.log.read_text().splitlines() and time.monotonic() < deadline:
            time.sleep(0.1)
        leader = psutil.Process(child.popen.pid)
        family = [leader, *leader.children()]
        assert len(family) == 2
        assert sup.stop_all() == 1
        assert gone(family) == []
    finally:
        sup.stop_all()  # idempotent: nothing of this test outlives it


def test_worker_progress_lines_become_stages_and_other_output_is_logged(tmp_path):
    """A worker started with --progress-json: its JSON lines drive the screen (one
    line per stage off a terminal), anything else on its stdout goes to its log."""
    events = [
        {"event": "loading", "worker_id": "cpu0", "model": "m.gguf"},
        {"event": "measuring", "worker_id": "cpu0", "done": 1, "total": 4},
        {"event": "measuring", "worker_id": "cpu0", "done": 4, "total": 4},
        {"event": "error", "message": "a warning the worker chose to report"},
    ]
    script = "import json; print('plain text'); " + "; ".join(
        f"print(json.dumps({e!r}))" for e in events
    )
    proc = Proc("cpu0", "worker", ("-c", script, "--progress-json"))
    plan = Plan((proc,), (), "tcp://x:0", "tcp://y:0", "http://127.0.0.1:0", None)
    out = io.StringIO()
    screen = Screen(Console(file=out, force_terminal=False, width=200))
    sup = Supervisor(plan, tmp_path, screen, "m", prefix=(sys.executable,))
    child = sup.children[0]
    try:
        sup._start(child)
        child.popen.wait(timeout=30)
        for reader in child.readers:
            reader.join(timeout=10)
        sup._drain_events()
    finally:
        sup.stop_all()
    lines = out.getvalue().splitlines()
    assert any("cpu0" in x and "loading m.gguf" in x for x in lines), lines
    assert sum("measuring" in x for x in lines) == 1  # one line per stage, not per step
    assert any("a warning the worker chose to report" in x for x in lines)
    log = child.log.read_text()
    assert "plain text" in log and '"event"' not in log


def test_ctrl_c_at_the_terminal_stops_everything(tmp_path):
    """Ctrl-C signals the terminal's foreground group: serve alone (its children have
    groups of their own) stops them all and exits 0. Simulated workers: no model runs."""
    port, client_addr, worker_addr = free_addresses()
    cmd = serve_command(port, client_addr, worker_addr) + [
        "--set", "worker.backend='sim'", "--set", "worker.profile='cpu-m2'",
        "--run-dir", str(tmp_path),
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("ready:"):
                break
        assert lines and lines[-1].startswith("ready:"), "".join(lines)
        children = psutil.Process(proc.pid).children(recursive=True)
        assert len(children) == 3
        os.killpg(proc.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
        assert proc.wait(timeout=30) == 0
        assert gone(children) == []
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_remote_workers_are_listed_with_their_nodes_as_they_attach_and_die(tmp_path):
    """[[workers]] remote = true: serve is ready without it and prints the tandem join
    command for it; a worker of another host that nobody expected is listed with its
    node when it attaches, and said gone when it is killed outright (simulated
    workers: no model). `tandem status --json` names every worker's node."""
    keys = tmp_path / "keys"
    make_keys(keys)
    config = tmp_path / "tandem.toml"
    config.write_text(
        "[worker]\nbackend = 'sim'\nprofile = 'cpu-m2'\n"
        "[[workers]]\nworker_id = 'cpu0'\n[[workers]]\nworker_id = 'far0'\nremote = true\n"
    )
    join_addr = free_tcp_address()
    s = Served(["--config", str(config), "--keys", str(keys), "--join-addr", join_addr,
                "--run-dir", str(tmp_path / "run")])  # fmt: skip
    extra = None
    try:
        s.expect("ready:")
        attach = s.expect("expects", "far0")
        assert f"tandem join {join_addr} --token tdj1." in attach and "--node far0" in attach
        cmd = [sys.executable, "-m", "tandem", "worker", "--router", s.worker_addr,
               "--worker-id", "extra0", "--node", "elsewhere", "--backend", "sim",
               "--profile", "cpu-m2", "--keys", str(keys)]  # fmt: skip
        extra = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        s.expect("extra0", "(remote, node elsewhere)", "registered", timeout_s=60)
        status = [sys.executable, "-m", "tandem", "status", "--json", "--router",
                  s.client_addr, "--keys", str(keys)]  # fmt: skip
        rows = json.loads(subprocess.run(status, capture_output=True, check=True).stdout)
        nodes = {w["id"]: w["node"] for w in rows["workers"]}
        assert nodes == {"cpu0": default_node(), "extra0": "elsewhere"}
        extra.kill()  # no Goodbye: the router notices the closed connection
        s.expect("extra0", "(remote, node elsewhere)", "left the router", timeout_s=30)
    finally:
        if extra is not None:
            extra.kill()
            extra.wait(timeout=10)
        s.proc.terminate()
        assert s.proc.wait(timeout=30) == 0


def test_children_do_not_outlive_a_killed_serve(tmp_path):
    """serve killed outright (no chance to stop anything): its children follow it
    (Linux: a parent-death signal), so no router is left holding its port."""
    port, client_addr, worker_addr = free_addresses()
    cmd = serve_command(port, client_addr, worker_addr) + [
        "--set", "worker.backend='sim'", "--set", "worker.profile='cpu-m2'",
        "--run-dir", str(tmp_path),
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("ready:"):
            break
    children = psutil.Process(proc.pid).children(recursive=True)
    assert len(children) == 3
    proc.kill()
    proc.wait()
    _, alive = psutil.wait_procs(children, timeout=15)
    for p in alive:
        p.kill()
    assert alive == []


def test_a_worker_that_keeps_failing_is_restarted_then_given_up_with_its_words(tmp_path):
    """Each death of a worker that fails by itself shows its log's last lines and a
    growing backoff; one that never registers is given up after a few tries, and
    with no worker left serve exits non-zero saying so."""
    failing = "import sys; print('boom: no such device', file=sys.stderr); sys.exit(3)"
    proc = Proc("cpu0", "worker", ("-c", failing))
    sock = f"ipc://{tmp_path}/none.sock"  # no router there: nothing registers
    plan = Plan((proc,), (), sock, sock + "w", "http://127.0.0.1:0", None)
    out = io.StringIO()
    screen = Screen(Console(file=out, force_terminal=False, width=200))
    sup = Supervisor(plan, tmp_path, screen, "m", prefix=(sys.executable,))
    assert sup.run() == 1
    text = out.getvalue()
    assert "exited with code 3; restarting in 1 s" in text
    assert "exited with code 3; restarting in 2 s" in text
    assert "boom: no such device" in text
    assert "given up" in text and "no worker could start" in text
    assert sup.children[0].log.read_text().count("boom: no such device\n") == 3  # 3 starts
