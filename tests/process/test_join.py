"""`tandem join` as a user runs it: the command `tandem serve --listen` prints, run as
printed on another "host" (its own cache folder, loopback), joins, and its worker
serves a request; the used token, an unknown one and an address where nothing
listens each fail with their own words and exit code; a joined worker killed is
restarted by its joiner; the serve screen says when the joined worker leaves and
comes back."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tandem.client.sync import Client
from tandem.launcher.cluster import free_tcp_address
from tests.helpers import needs_llama
from tests.process.test_serve import Served, Watched


class Joiner(Watched):
    """A `tandem join` process (the printed command) and its output, line by line."""

    def __init__(self, argv: list[str], home: Path) -> None:
        assert argv[:2] == ["tandem", "join"], argv
        env = {**os.environ, "TANDEM_CACHE_DIR": str(home)}  # another host's state
        super().__init__([sys.executable, "-m", *argv], env)


def run_join(argv: list[str], home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TANDEM_CACHE_DIR": str(home)}
    return subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True,
                          env=env, timeout=120)  # fmt: skip


@needs_llama
@pytest.mark.model
@pytest.mark.timeout(600)
def test_the_printed_join_command_joins_and_its_worker_serves(tmp_path):
    config = tmp_path / "tandem.toml"  # no local worker: the joined one serves alone
    config.write_text("[[workers]]\nworker_id = 'far'\nremote = true\n")
    run = tmp_path / "run"
    s = Served(["--config", str(config), "--listen", "127.0.0.1",
                "--join-addr", free_tcp_address(), "--run-dir", str(run)])  # fmt: skip
    joiner = None
    try:
        s.expect("ready:")
        general = shlex.split(s.expect("join", "on another host:").split("on another host: ")[1])
        s.expect("--listen HOST")  # loopback: the screen says how other hosts get in
        printed = s.expect("expects", "far:").split("on its host: ", 1)[1]
        joiner = Joiner(shlex.split(printed), tmp_path / "far-host")
        joiner.expect("joined:")
        s.expect("far-cpu0", "(remote, node far)", "registered", timeout_s=60)
        with Client(s.client_addr, keys=str(run / "keys"), timeout_s=120) as c:
            result = c.generate("Say hello.", max_tokens=4, temperature=0.0)
            assert result.stats["worker"] == "far-cpu0" and result.stats["output_tokens"] >= 1
            assert {w["node"] for w in c.status().workers} == {"far"}
        # The token far used, presented by another host: refused, in words.
        used = run_join(shlex.split(printed.replace("--node far", "--node pc")), tmp_path / "pc")
        assert used.returncode == 2 and "already used by another host" in used.stderr, used
        # A token this router never issued (another router's, or mistyped but well-formed).
        token = general[general.index("--token") + 1]
        other = token[:-6] + ("AAAAAA" if not token.endswith("AAAAAA") else "BBBBBB")
        bad = run_join([*general[:-1], other, "--node", "pc2"], tmp_path / "pc2")
        assert bad.returncode == 2 and "refused the join token" in bad.stderr, bad
        # Nothing listening: the network, not the token.
        gone = run_join(["tandem", "join", free_tcp_address(), "--token", token,
                         "--timeout-s", "2"], tmp_path / "pc3")  # fmt: skip
        assert gone.returncode == 3 and "nothing answered" in gone.stderr, gone
        assert "token" not in gone.stderr.split("nothing answered")[0]
        # Its worker killed outright: the joiner restarts it, and serve sees both.
        worker = psutil.Process(joiner.proc.pid).children()[0]
        worker.kill()
        joiner.expect("killed by SIGKILL; restarting")
        s.expect("far-cpu0", "(remote, node far)", "left the router", timeout_s=30)
        joiner.expect("far-cpu0 registered with the router")
        s.expect("far-cpu0", "(remote, node far)", "registered", timeout_s=60)
        joiner.proc.terminate()
        assert joiner.proc.wait(timeout=30) == 0
        s.expect("far-cpu0", "(remote, node far)", "left the router", timeout_s=30)
    finally:
        if joiner is not None and joiner.proc.poll() is None:
            joiner.proc.kill()
        s.proc.terminate()
        assert s.proc.wait(timeout=30) == 0
