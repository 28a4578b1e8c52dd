"""A client whose handshake the router refuses (issue 28, item 4): every pending and
later call fails at once with HandshakeRefused, sync and async, and no send blocks.

A keyed ROUTER socket with the router's own authenticator (common/auth.py) stands in
for the router: the refusal happens in the handshake, before the router's code runs.
Three ways to be refused: no keys at all (libzmq reports a protocol mismatch and
drops the connection for good), a key the router does not accept (refused, dropped
for good), and a wrong router key (no answer; libzmq retries forever)."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import pytest

from tandem.client import AsyncClient, Client, HandshakeRefused
from tandem.common.auth import RouterGuard, make_keys
from tandem.common.settings import Addresses
from tandem.common.transport import RouterSocket
from tandem.launcher.cluster import free_tcp_address

pytestmark = pytest.mark.timeout(120)
PATIENCE_S = 60.0  # every timeout the clients are given: a hang would take this long
AT_ONCE_S = 15.0  # "at once", with a wide margin for a loaded 2-core machine


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    root = tmp_path_factory.mktemp("keys")
    make_keys(root / "keys")
    make_keys(root / "other")
    stranger = root / "stranger"  # the right router key, a client key it does not know
    stranger.mkdir()
    shutil.copy(root / "keys" / "router.key", stranger)
    shutil.copy(root / "other" / "client.key_secret", stranger)
    address = free_tcp_address()
    guard = RouterGuard.start(str(root / "keys"), Addresses(address, "inproc://unused"))
    sock = RouterSocket(address, setup=guard.setup("clients"))
    yield address, {"none": None, "stranger": str(stranger), "wrong_router": str(root / "other")}
    sock.sock.close(linger=0)
    guard.stop()


KINDS = ["none", "stranger", "wrong_router"]


def _sync_calls(c: Client) -> list:
    return [lambda: c.generate("hi", max_tokens=2), c.status, c.ping]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("idle_s", [0.0, 0.5])  # at once, or refused while idle first
def test_sync_client_fails_every_call_at_once(router, kind, idle_s):
    address, keys = router
    c = Client(address, timeout_s=PATIENCE_S, connect_timeout_s=PATIENCE_S, keys=keys[kind])
    try:
        time.sleep(idle_s)
        for call in _sync_calls(c):
            t0 = time.monotonic()
            with pytest.raises(HandshakeRefused, match="refused our handshake") as e:
                call()
            assert time.monotonic() - t0 < AT_ONCE_S
        assert ("no keys" in e.value.message) == (kind == "none")
    finally:
        c.close()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("idle_s", [0.0, 0.5])
def test_async_client_fails_every_call_at_once(router, kind, idle_s):
    address, keys = router

    async def run() -> None:
        async with AsyncClient(address, timeout_s=PATIENCE_S, keys=keys[kind]) as c:
            await asyncio.sleep(idle_s)
            # Two at once: both pending when the refusal comes (idle_s 0).
            pending = await asyncio.wait_for(
                asyncio.gather(c.status(), c.generate("hi"), return_exceptions=True),
                AT_ONCE_S,
            )
            assert all(isinstance(x, HandshakeRefused) for x in pending), pending
            for call in (c.status, lambda: c.generate("hi", max_tokens=2)):
                with pytest.raises(HandshakeRefused):
                    await asyncio.wait_for(call(), AT_ONCE_S)

    asyncio.run(run())


def test_unknown_keys_folder_is_refused_before_connecting(tmp_path: Path):
    with pytest.raises(ValueError, match="not a tandem keys folder"):
        Client(free_tcp_address(), keys=str(tmp_path))
