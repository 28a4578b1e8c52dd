"""A serving process raises its descriptor limit to the hard one, and the gateway
sizes its connection cap from the result."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tandem.common.fdlimit import CEILING
from tandem.gateway.config import GatewayConfig
from tandem.gateway.main import FD_RESERVE, connection_cap

resource = pytest.importorskip("resource")
LOW = 256


def _lowered() -> None:  # in the child, before exec
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (LOW, hard))


def test_the_soft_limit_rises_to_the_hard_one():
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = CEILING if hard == resource.RLIM_INFINITY else min(hard, CEILING)
    if want <= LOW:
        pytest.skip(f"the hard limit here ({hard}) leaves nothing to raise")
    code = (
        "import resource; from tandem.common.fdlimit import raise_fd_limit; "
        "n = raise_fd_limit(); print(n, resource.getrlimit(resource.RLIMIT_NOFILE)[0])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], preexec_fn=_lowered, capture_output=True, text=True,
        check=True, timeout=60,
    ).stdout  # fmt: skip
    returned, soft = map(int, out.split())
    assert returned == soft == want


def test_the_connection_cap_comes_from_the_limit_unless_given():
    cfg = GatewayConfig("tcp://127.0.0.1:1")
    assert connection_cap(cfg, 1024) == 1024 - FD_RESERVE
    assert connection_cap(cfg, 10) == 1  # never none at all
    assert connection_cap(cfg, None) is None  # no limit on this platform: no cap
    assert connection_cap(GatewayConfig("tcp://127.0.0.1:1", max_connections=7), 1024) == 7
    with pytest.raises(ValueError, match="max_connections"):
        GatewayConfig("tcp://127.0.0.1:1", max_connections=-1)


def test_a_cap_below_the_reported_hard_limit_is_tried_next(monkeypatch):
    """macOS reports an unlimited hard limit and refuses more than OPEN_MAX."""
    from tandem.common.fdlimit import DARWIN_OPEN_MAX, raise_fd_limit

    asked = []

    def setrlimit(which, limits):
        asked.append(limits[0])
        if limits[0] > DARWIN_OPEN_MAX:
            raise ValueError("current limit exceeds maximum limit")

    monkeypatch.setattr(resource, "getrlimit", lambda which: (LOW, resource.RLIM_INFINITY))
    monkeypatch.setattr(resource, "setrlimit", setrlimit)
    assert raise_fd_limit() == DARWIN_OPEN_MAX
    assert asked == [CEILING, DARWIN_OPEN_MAX]

    def refuse(which, limits):
        raise OSError("not permitted")

    monkeypatch.setattr(resource, "setrlimit", refuse)
    assert raise_fd_limit() == LOW  # left as it was
