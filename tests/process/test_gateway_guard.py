"""The gateway against hostile and misconfigured clients, as real processes (issue 28,
items 3-5): malformed bodies are 400s, slow clients are cut off while others are
served, one address holds a bounded number of connections, and a gateway whose keys
the router refuses says so and exits instead of hanging."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tandem.common.auth import make_keys
from tandem.common.fdlimit import CEILING
from tandem.launcher.cluster import Cluster, WorkerSpec
from tests.chaos import GPU
from tests.process.test_gateway import call as post

pytestmark = pytest.mark.timeout(180)
CLOSE_BOUND_S = 30.0  # the test's patience; the gateway's deadlines here are 1 s
CAP = 3


@contextlib.contextmanager
def inherited_soft_fd_limit(n: int):
    """Processes started inside inherit a soft descriptor limit of at most ``n``: what
    a fresh Linux login gives (1,024) rather than what this machine's shell may."""
    try:
        import resource
    except ImportError:
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, n), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.fixture(scope="module")
def served():
    with inherited_soft_fd_limit(512), Cluster(workers=[WorkerSpec("w", GPU)]) as c:
        c.slow_url = c.start_gateway(
            "gateway-slow", ("--header-timeout-s", "1", "--body-timeout-s", "1")
        )
        c.capped_url = c.start_gateway("gateway-capped", ("--max-connections-per-client", str(CAP)))
        c.full_url = c.start_gateway("gateway-full", ("--max-connections", str(CAP)))
        c.model = json.loads(urllib.request.urlopen(f"{c.slow_url}/v1/models").read())
        yield c


def host_port(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def models_ok(url: str, source: str = "127.0.0.1") -> bool:
    conn = http.client.HTTPConnection(*host_port(url), timeout=30, source_address=(source, 0))
    try:
        conn.request("GET", "/v1/models")
        return conn.getresponse().status == 200
    finally:
        conn.close()


def closed_by_peer(sock: socket.socket) -> bool:
    """True once the gateway has closed ``sock`` (EOF or reset); False while open."""
    try:
        return sock.recv(4096) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def trickle_until_closed(sock: socket.socket, piece: bytes, also: callable) -> float:
    """Send ``piece`` every 0.25 s until the gateway closes ``sock`` (its age then);
    ``also()`` runs once meanwhile, while ``sock`` is still open."""
    sock.settimeout(0.25)
    t0, ran = time.monotonic(), False
    while time.monotonic() - t0 < CLOSE_BOUND_S:
        try:
            sock.sendall(piece)
        except (BrokenPipeError, ConnectionResetError):
            return time.monotonic() - t0
        if not ran:
            also()
            ran = True
        if closed_by_peer(sock):
            return time.monotonic() - t0
    raise AssertionError(f"the gateway kept a trickling connection for {CLOSE_BOUND_S}s")


@pytest.mark.parametrize(
    ("opening", "piece"),
    [
        (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n", b"X-Pad: y\r\n"),  # headers
        (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 4096\r\n\r\n", b"{"),
        (b"", b""),  # connects and says nothing
    ],
    ids=["headers", "body", "silent"],
)
def test_slow_clients_are_closed_while_others_are_served(served, opening, piece):
    served_meanwhile = []
    with socket.create_connection(host_port(served.slow_url), timeout=5) as sock:
        sock.sendall(opening)
        trickle_until_closed(
            sock, piece, lambda: served_meanwhile.append(models_ok(served.slow_url))
        )
    assert served_meanwhile == [True]
    assert models_ok(served.slow_url)  # and after
    reason = "slow_body" if piece == b"{" else "slow_headers"
    metrics = urllib.request.urlopen(f"{served.slow_url}/metrics", timeout=30).read().decode()
    line = f'tandem_gateway_connections_refused_total{{reason="{reason}"}} '
    assert float(metrics.split(line)[1].split()[0]) >= 1


def test_one_address_holds_a_bounded_number_of_connections(served):
    url = served.capped_url
    held = [socket.create_connection(host_port(url), timeout=5) for _ in range(CAP)]
    try:
        with socket.create_connection(host_port(url), timeout=30) as extra:
            answer = extra.recv(4096)  # answered without asking, then closed
            assert answer.startswith(b"HTTP/1.1 429") and b"too_many_connections" in answer
        assert models_ok(url, source="127.0.0.2")  # another address is served meanwhile
    finally:
        _one_closed_then_served(url, held)


def test_all_addresses_together_hold_a_bounded_number_of_connections(served):
    """A flood from many addresses fills the total cap: one more is answered 503 (not
    reset, not left hanging), the connections already open are served, and a slot
    frees once one closes."""
    url = served.full_url
    held = [
        socket.create_connection(host_port(url), timeout=5, source_address=(f"127.0.0.{i}", 0))
        for i in range(2, 2 + CAP)
    ]
    try:
        with socket.create_connection(
            host_port(url), timeout=30, source_address=("127.0.0.9", 0)
        ) as extra:
            answer = extra.recv(4096)
            assert answer.startswith(b"HTTP/1.1 503") and b"too_many_connections" in answer
        opened = held[0]  # an open connection is still served
        opened.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        scraped = _whole_response(opened)
        assert scraped.startswith(b"HTTP/1.1 200")
        assert f"tandem_gateway_connections_open {CAP}.0".encode() in scraped
        assert f"tandem_gateway_connections_max {CAP}.0".encode() in scraped
        assert b'tandem_gateway_connections_refused_total{reason="over_total"} 1.0' in scraped
    finally:
        _one_closed_then_served(url, held)


def test_router_and_gateway_raise_their_descriptor_limits(served):
    psutil = pytest.importorskip("psutil")
    if not hasattr(psutil.Process, "rlimit"):
        pytest.skip("psutil reads other processes' limits on Linux only")
    for name in ("router", "gateway-full"):
        soft, hard = psutil.Process(served.procs[name].pid).rlimit(psutil.RLIMIT_NOFILE)
        assert soft == min(hard, CEILING) or hard == psutil.RLIM_INFINITY and soft == CEILING


def _whole_response(sock: socket.socket) -> bytes:
    """One HTTP response read off ``sock`` to the end of its declared length."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def _one_closed_then_served(url: str, held: list[socket.socket]) -> None:
    """Close one of ``held``: a slot frees once the gateway sees the close; then the rest."""
    held.pop().close()
    deadline = time.monotonic() + CLOSE_BOUND_S
    while not _served_now(url) and time.monotonic() < deadline:
        time.sleep(0.1)
    try:
        assert _served_now(url)
    finally:
        for s in held:
            s.close()


def _served_now(url: str) -> bool:
    try:
        return models_ok(url)
    except (ConnectionError, http.client.HTTPException):
        return False


# The reproductions, end to end: each was a 500 with a traceback.
MSGS = [{"role": "user", "content": "hi"}]
BAD_BODIES = {
    "surrogate_prompt": ("/v1/completions", json.dumps({"prompt": "\udcff"}).encode()),
    "surrogate_message": (
        "/v1/chat/completions",
        json.dumps({"messages": [{"role": "user", "content": "\udcff"}]}).encode(),
    ),
    "deep_json": ("/v1/chat/completions", b"[" * 100_000 + b"]" * 100_000),
    "token_id_2_64": ("/v1/completions", json.dumps({"prompt": [1, 2**64]}).encode()),
    "max_tokens_2_64": ("/v1/completions", json.dumps({"prompt": "a", "max_tokens": 2**64}).encode()),  # noqa: E501
    "seed_2_64": ("/v1/chat/completions", json.dumps({"messages": MSGS, "seed": 2**64}).encode()),
    "top_k_2_64": ("/v1/chat/completions", json.dumps({"messages": MSGS, "top_k": 2**64}).encode()),
    "top_k_string": ("/v1/chat/completions", json.dumps({"messages": MSGS, "top_k": "4"}).encode()),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(BAD_BODIES))
def test_malformed_bodies_are_openai_400s(served, name):
    path, body = BAD_BODIES[name]
    status, answer = post(served.slow_url + path, body)
    assert status == 400, answer
    assert answer["error"]["type"] == "invalid_request_error" and answer["error"]["message"]
    ok = {"prompt": "a", "max_tokens": 2}
    assert post(served.slow_url + "/v1/completions", json.dumps(ok).encode())[0] == 200


def test_keys_on_gateway_top_and_status(tmp_path: Path):
    keys = tmp_path / "keys"
    make_keys(keys)
    with Cluster(workers=[WorkerSpec("w", GPU)], keys=str(keys)) as c:
        t0 = time.monotonic()
        with pytest.raises(RuntimeError, match="refused our handshake") as e:
            c.start_gateway("gateway-keyless")  # no --keys: refused, and it says so
        assert "no keys" in str(e.value) and time.monotonic() - t0 < CLOSE_BOUND_S
        url = c.start_gateway("gateway-keyed", ("--keys", str(keys)))
        status, answer = post(
            f"{url}/v1/completions", json.dumps({"prompt": "a", "max_tokens": 2}).encode()
        )
        assert status == 200 and answer["usage"]["completion_tokens"] == 2
        for command in (["top", "--once"], ["status", "--json"]):
            args = [sys.executable, "-m", "tandem", *command, "--router", c.client_addr]
            keyed = subprocess.run(
                [*args, "--keys", str(keys)], capture_output=True, text=True, timeout=60
            )
            assert keyed.returncode == 0 and "w" in keyed.stdout + keyed.stderr
            if command[0] == "top":  # piped: every header whole, not squeezed to 80 columns
                headers = ("worker", "device", "routed", "blocks", "prefill", "decode", "caps")
                assert all(f" {h} " in keyed.stdout for h in headers), keyed.stdout
            keyless = subprocess.run(args, capture_output=True, text=True, timeout=60)
            assert "refused our handshake" in keyless.stdout + keyless.stderr
