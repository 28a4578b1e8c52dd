"""A router killed during the CURVE handshake is a router gone, not a refusal of our
keys (issue 38, item 4).

A real keyed router is stopped (SIGSTOP: the kernel still accepts the connection,
the router answers nothing), ``tandem status`` connects to it, and the router is
killed once the connection is open: the handshake ends with no answer, as it does
for a wrong router key. The CLI must say the router is gone (``router_unavailable``),
never ``handshake_refused``, which tells the user their keys are wrong.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tandem.client import RouterUnavailable
from tandem.common.auth import make_keys
from tandem.launcher.cluster import Cluster

pytestmark = pytest.mark.timeout(120)
PATIENCE_S = 60.0  # a wait that only a hang would use up


def _connected_to(port: int) -> bool:
    """An open TCP connection to ``port`` on this host (the client's, to the router)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            rows = [line.split() for line in f.readlines()[1:]]
        # Columns: sl, local address, remote address, state (01: established).
        if any(int(r[2].rsplit(":", 1)[1], 16) == port and r[3] == "01" for r in rows):
            return True
    return False


def _wait_listening(cl: Cluster) -> None:
    """Until the router answers (a cluster with no worker does not wait for it)."""
    deadline = time.monotonic() + PATIENCE_S
    with cl.client(timeout_s=PATIENCE_S) as c:
        while True:
            try:
                c.status()
                return
            except RouterUnavailable:
                assert time.monotonic() < deadline, "the router never listened"


def _status_connected(address: str, keys: Path, port: int) -> subprocess.Popen[str] | None:
    """``tandem status`` run until its connection to ``port`` is open, or None when it
    gave up first (on a loaded machine its connect can miss the client's 1 s)."""
    cli = subprocess.Popen(
        [sys.executable, "-m", "tandem", "status", "--router", address, "--keys", str(keys)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    deadline = time.monotonic() + PATIENCE_S
    while not _connected_to(port):
        if cli.poll() is not None:
            cli.communicate()
            return None
        assert time.monotonic() < deadline, "the CLI never connected"
        time.sleep(0.05)
    return cli


def test_a_router_killed_mid_handshake_is_gone_not_refusing_keys(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    make_keys(keys)
    with Cluster(transport="tcp", keys=str(keys)) as cl:
        router = cl.procs["router"]
        port = int(cl.client_addr.rsplit(":", 1)[1])
        _wait_listening(cl)
        router.send_signal(signal.SIGSTOP)
        try:
            for _ in range(5):
                cli = _status_connected(cl.client_addr, keys, port)
                if cli is not None:
                    break
            assert cli is not None, "no try connected before giving up"
        finally:
            router.kill()  # mid-handshake: the stopped router never answered it
            router.wait()
        _, err = cli.communicate(timeout=PATIENCE_S)
    assert cli.returncode == 1, err
    assert "handshake_refused" not in err and "keys" not in err.lower(), err
    assert "error (router_unavailable)" in err, err
    assert "closed our connection during the handshake" in err, err
