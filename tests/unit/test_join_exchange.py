"""The join exchange over real CURVE sockets on loopback, in this process: a token
admits one host and authorizes its key for the router's worker socket; a used,
expired, unknown or mistyped token, another router's key and an address where nothing
listens are each told apart, and nothing secret is readable by other users."""

from __future__ import annotations

import stat
import time

import pytest
import zmq
import zmq.auth

from tandem.common.auth import make_keys
from tandem.common.join import JOIN_VERSION, JoinRequest, JoinToken, decode_reply, encode
from tandem.common.zapgate import KeyFolder
from tandem.launcher import join as joining
from tandem.launcher.cluster import free_tcp_address
from tandem.launcher.joinservice import JoinService, Offer, private_keys
from tandem.launcher.tokens import JoinTokens


@pytest.fixture
def service(tmp_path):
    keys = private_keys(tmp_path / "keys")
    router_key = zmq.auth.load_certificate(keys / "router.key")[0]
    offer = Offer("tcp://0.0.0.0:5556", "org/Smol-GGUF:Q4_1", "smol-Q4_1.gguf")
    svc = JoinService("tcp://127.0.0.1:0", keys, offer, JoinTokens(router_key, ttl_s=30.0))
    svc.start()
    yield svc
    svc.close()


def join(svc: JoinService, token: JoinToken, root, node: str = "mac", timeout_s: float = 10.0):
    return joining.join(svc.address, token, node, ["cpu", "metal:0"], timeout_s, root)


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_token_admits_a_host_whose_key_the_router_then_accepts(service, tmp_path):
    accepts = KeyFolder(service.keys / "workers")
    token = service.issue()
    joined = join(service, token, tmp_path / "mac")
    # The worker socket binds every interface: the joiner uses the host it reached.
    assert joined.worker_addr == "tcp://127.0.0.1:5556"
    assert joined.answer.model == "org/Smol-GGUF:Q4_1" and joined.answer.portable
    public = zmq.auth.load_certificate(joined.keys / "worker.key_secret")[0]
    assert accepts.callback("workers", public)  # no router restart needed
    assert service.events.get(timeout=1) == ("mac", "joined (cpu, metal:0)")
    # Nothing secret readable by others: this host's folder and secret key, serve's keys.
    assert mode(joined.keys) == 0o700 and mode(joined.keys / "worker.key_secret") == 0o600
    assert mode(service.keys) == 0o700 and mode(service.keys / "router.key_secret") == 0o600
    # The same host again (a reboot, the printed command re-run): welcome, same key.
    assert join(service, token, tmp_path / "mac").keys == joined.keys
    assert service.events.empty()  # nothing new authorized
    # Removed, the key is refused from the next handshake on.
    for path in (service.keys / "workers").glob("join_*"):
        path.unlink()
    time.sleep(0.01)  # a folder mtime of its own
    assert not accepts.callback("workers", public)


def test_a_used_token_is_refused_to_another_host(service, tmp_path):
    token = service.issue()
    join(service, token, tmp_path / "mac")
    with pytest.raises(joining.Refused, match="already used by another host") as info:
        join(service, token, tmp_path / "pc", node="pc")
    assert info.value.reason == "used" and info.value.kind == "refused"
    assert len(list((service.keys / "workers").glob("join_*"))) == 1


def test_an_expired_and_an_unknown_token_are_refused(service, tmp_path):
    service.tokens.ttl_s = 0.01
    expired = service.issue()
    time.sleep(0.05)
    with pytest.raises(joining.Refused, match="expired"):
        join(service, expired, tmp_path / "a")
    unknown = JoinToken(expired.router_key, b"\x01" * 16)
    with pytest.raises(joining.Refused, match="not one this router issued"):
        join(service, unknown, tmp_path / "b")
    assert not list((service.keys / "workers").glob("join_*"))


def test_another_routers_key_is_not_the_router(service, tmp_path):
    impostor = JoinToken(zmq.curve_keypair()[0], service.issue().secret)
    with pytest.raises(joining.NotTheRouter, match="not as the router this token is for"):
        join(service, impostor, tmp_path / "a", timeout_s=5.0)


def test_nothing_listening_is_a_network_problem(tmp_path):
    keys = tmp_path / "k"
    make_keys(keys)
    token = JoinToken(zmq.auth.load_certificate(keys / "router.key")[0], b"\x02" * 16)
    with pytest.raises(joining.Unreachable, match="nothing answered") as info:
        joining.join(free_tcp_address(), token, "mac", [], 1.5, tmp_path / "j")
    assert info.value.kind == "network"


def test_a_flood_of_bad_requests_is_answered_and_authorizes_nothing(service, tmp_path):
    """2,000 frames that are no join request (and unknown secrets) from one peer: each
    answered bad_request / unknown, no key written; a real join then goes through."""
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.curve_serverkey = zmq.auth.load_certificate(service.keys / "router.key")[0]
    sock.curve_publickey, sock.curve_secretkey = zmq.curve_keypair()
    sock.connect(service.address)
    guess = encode(JoinRequest(v=JOIN_VERSION, secret=b"\x03" * 16, node="x"))
    frames = [b"\x81\xa4type\xa4join", b"not msgpack", guess, b"\x00" * 5000]
    try:
        for i in range(2000):
            sock.send(frames[i % 3])
        reasons = set()
        for _ in range(2000):
            assert sock.poll(10_000)
            reasons.add(decode_reply(sock.recv()).reason)
        sock.send(frames[3])  # over the size limit: the connection is closed, no answer
        assert not sock.poll(500)
    finally:
        sock.close(linger=0)
    assert reasons == {"bad_request", "unknown"}
    assert not list((service.keys / "workers").glob("join_*"))
    assert join(service, service.issue(), tmp_path / "mac").answer.v == JOIN_VERSION
