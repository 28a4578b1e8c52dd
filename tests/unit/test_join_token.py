"""The join token and its ledger (one host per token, an expiry, bounded memory), node
names, and the worker address a joiner derives: pure, no sockets."""

from __future__ import annotations

import msgspec
import pytest
import zmq

from tandem.common import protocol as p
from tandem.common.join import BadToken, JoinToken
from tandem.common.nodes import MAX_NODE_CHARS, checked_node, default_node, node_problem
from tandem.launcher.join import reachable
from tandem.launcher.tokens import JoinTokens

KEY_A, KEY_B = b"A" * 40, b"B" * 40


def tokens(ttl_s: float = 60.0, kept: int = 256) -> JoinTokens:
    return JoinTokens(zmq.curve_keypair()[0], ttl_s, kept)


def test_a_token_reads_back_and_carries_the_router_key():
    t = tokens().issue(0.0)
    text = t.text()
    assert text.startswith("tdj1.") and all(c.isalnum() or c in "._-" for c in text)
    assert JoinToken.parse(f"  {text}\n") == t  # pasted with spaces around


@pytest.mark.parametrize("text", ["", "abc", "tdj1.", "tdj1.!!!!", "tdj2.AAAA"])
def test_text_that_is_no_token_is_refused_before_any_connect(text):
    with pytest.raises(BadToken):
        JoinToken.parse(text)


def test_a_cut_token_is_called_damaged():
    text = tokens().issue(0.0).text()
    with pytest.raises(BadToken, match="damaged"):
        JoinToken.parse(text[:-3])


def test_one_host_per_token_the_same_host_again_and_nobody_else():
    ledger = tokens()
    t = ledger.issue(0.0)
    first = ledger.redeem(t.secret, KEY_A, "mac", 1.0)
    assert first.issued is not None and not first.repeat and first.issued.node == "mac"
    again = ledger.redeem(t.secret, KEY_A, "mac", 999.0)  # its host, later: nothing new
    assert again.issued is not None and again.repeat
    assert ledger.redeem(t.secret, KEY_B, "pc", 2.0).reason == "used"
    assert ledger.live(2.0) == 0


def test_a_node_name_another_host_joined_under_is_refused_and_the_token_kept():
    ledger = tokens()
    ledger.redeem(ledger.issue(0.0).secret, KEY_A, "mac", 1.0)
    t = ledger.issue(0.0)
    assert ledger.redeem(t.secret, KEY_B, "mac", 2.0).reason == "node_taken"
    assert ledger.redeem(t.secret, KEY_B, "mac2", 3.0).issued is not None


def test_an_unused_token_expires_and_an_unknown_one_is_unknown():
    ledger = tokens(ttl_s=10.0)
    t = ledger.issue(0.0)
    assert ledger.redeem(t.secret, KEY_A, "mac", 10.0).reason == "expired"
    assert ledger.redeem(b"x" * 16, KEY_A, "mac", 1.0).reason == "unknown"
    assert ledger.live(5.0) == 1 and ledger.live(10.0) == 0


def test_the_ledger_is_bounded_under_a_flood_of_issues():
    ledger = tokens(kept=8)
    first = ledger.issue(0.0)
    for i in range(10_000):
        ledger.issue(float(i))
    assert len(ledger.issued) == 8
    assert ledger.redeem(first.secret, KEY_A, "mac", 1.0).reason == "unknown"  # forgotten


@pytest.mark.parametrize("name", ["mac-studio", "a", "ray.0f3c_9", "x" * MAX_NODE_CHARS])
def test_node_names_that_pass(name):
    assert checked_node(name) == name


@pytest.mark.parametrize("name", ["", "-lead", "a b", "x" * (MAX_NODE_CHARS + 1), "é", "a\x00"])
def test_node_names_that_do_not(name):
    assert node_problem(name) is not None
    with pytest.raises(ValueError, match="node name"):
        checked_node(name)


def test_the_default_node_is_tandem_node_else_the_host(monkeypatch):
    monkeypatch.setenv("TANDEM_NODE", "rack2-gpu")
    assert default_node() == "rack2-gpu"
    monkeypatch.setenv("TANDEM_NODE", "no good")
    with pytest.raises(ValueError):
        default_node()
    monkeypatch.delenv("TANDEM_NODE")
    assert node_problem(default_node()) is None


def test_a_ready_with_a_bad_node_is_refused_at_decode():
    ready = p.Ready("w", "sim", "cpu", "m", 1, 64, 16, 1.0, [1.0], 0.5, {}, node="ok-1")
    assert p.decode(p.encode(ready)).node == "ok-1"
    raw = msgspec.msgpack.decode(p.encode(ready))
    for bad in ("x" * 65, "a b", "-x"):
        with pytest.raises(p.ProtocolError, match="node"):
            p.decode(msgspec.msgpack.encode({**raw, "node": bad}))


@pytest.mark.parametrize(
    ("bound", "via", "want"),
    [
        ("tcp://0.0.0.0:5556", "tcp://10.0.0.5:5557", "tcp://10.0.0.5:5556"),
        ("tcp://*:5556", "tcp://box.lan:5557", "tcp://box.lan:5556"),
        ("tcp://10.0.0.9:5556", "tcp://10.0.0.5:5557", "tcp://10.0.0.9:5556"),
        ("ipc:///tmp/w.sock", "tcp://10.0.0.5:5557", "ipc:///tmp/w.sock"),
    ],
)
def test_a_wildcard_worker_address_becomes_the_host_the_joiner_reached(bound, via, want):
    assert reachable(bound, via) == want
