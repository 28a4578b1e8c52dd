"""No router at the address (issue 30): every call of the sync and async clients fails
with RouterUnavailable, naming the address and `tandem serve`, in about ``no_router_s``
(1 s) — while a router that is there but slow to answer, or that binds a moment
after the call began, is waited for. Real sockets on free ports; a ROUTER socket
stands in for the router."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest

from tandem.client import AsyncClient, Client, RouterLost, RouterUnavailable
from tandem.common import protocol as p
from tandem.common.transport import RouterSocket
from tandem.launcher.cluster import free_tcp_address

pytestmark = pytest.mark.timeout(120)
PATIENCE_S = 60.0  # every other timeout the clients get: a hang would take this long
WELL_UNDER_S = 3.0  # the bound the error must meet; it comes at ~1 s (no_router_s)
SLOW_S = 2.5  # a live router that answers this late (> no_router_s) is still waited for


def _sync_calls(c: Client) -> list[Callable[[], object]]:
    return [c.status, c.ping, lambda: c.generate("hi", max_tokens=2)]


def _async_calls(c: AsyncClient) -> list[Callable[[], object]]:
    return [c.status, lambda: c.generate("hi", max_tokens=2)]


def _check(exc: RouterUnavailable, address: str) -> None:
    assert isinstance(exc, RouterLost) and exc.code == "router_unavailable"
    assert address in exc.message and "tandem serve" in exc.message


def test_sync_calls_fail_fast_naming_the_address_and_the_fix():
    address = free_tcp_address()
    with Client(address, timeout_s=PATIENCE_S, connect_timeout_s=PATIENCE_S) as c:
        for call in _sync_calls(c):
            t0 = time.monotonic()
            with pytest.raises(RouterUnavailable) as e:
                call()
            assert time.monotonic() - t0 < WELL_UNDER_S
            _check(e.value, address)


def test_async_calls_fail_fast_naming_the_address_and_the_fix():
    address = free_tcp_address()

    async def run() -> None:
        async with AsyncClient(address, timeout_s=PATIENCE_S) as c:
            for call in _async_calls(c):
                t0 = time.monotonic()
                with pytest.raises(RouterUnavailable) as e:
                    await call()  # type: ignore[misc]
                assert time.monotonic() - t0 < WELL_UNDER_S
                _check(e.value, address)

    asyncio.run(run())


def _router(address: str, delay_s: float, bind_after_s: float = 0.0) -> threading.Thread:
    """A stand-in router bound after ``bind_after_s`` that answers one status query
    ``delay_s`` after it arrived, then stays bound for a moment and closes."""

    def serve() -> None:
        time.sleep(bind_after_s)
        sock = RouterSocket(address)
        try:
            assert sock.sock.poll(int(PATIENCE_S * 1000))
            identity, msg = sock.recv()
            assert isinstance(msg, p.StatusQuery)
            time.sleep(delay_s)  # a busy loop: the connection is open, nothing is read
            sock.send(identity, p.StatusReply("stand-in", []))
            time.sleep(0.5)
        finally:
            sock.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize(("delay_s", "bind_after_s"), [(SLOW_S, 0.0), (0.0, 0.3)])
def test_a_slow_or_just_started_router_is_waited_for(delay_s, bind_after_s):
    address = free_tcp_address()
    t = _router(address, delay_s, bind_after_s)
    with Client(address, timeout_s=PATIENCE_S, connect_timeout_s=PATIENCE_S) as c:
        assert c.status().policy == "stand-in"
    t.join(10)
    address = free_tcp_address()
    t = _router(address, delay_s, bind_after_s)

    async def run() -> str:
        async with AsyncClient(address, timeout_s=PATIENCE_S) as ac:
            return (await ac.status()).policy

    assert asyncio.run(run()) == "stand-in"
    t.join(10)


def test_what_a_failed_call_queued_never_reaches_a_router_started_later():
    address = free_tcp_address()
    with Client(address, timeout_s=PATIENCE_S) as c:
        with pytest.raises(RouterUnavailable):
            c.generate("hi", max_tokens=2)

        async def run() -> None:
            async with AsyncClient(address, timeout_s=PATIENCE_S) as ac:
                with pytest.raises(RouterUnavailable):
                    await ac.generate("hi", max_tokens=2)
                sock = RouterSocket(address)  # both clients connect to it now
                try:
                    await asyncio.sleep(1.0)
                    assert not sock.sock.poll(0), sock.recv()
                finally:
                    sock.close()

        asyncio.run(run())
