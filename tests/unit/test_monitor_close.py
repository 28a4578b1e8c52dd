"""A socket monitor's reading end must not close before the monitor is stopped.

libzmq sends monitor events from the context's I/O thread with a blocking send: an
event for a monitor whose reader is gone blocks that thread, and with it every
socket of the context. Each test here runs in a context of its own (never the
process's shared one), and gives a blocked event a reader before it ends, so that
the context can terminate."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from tandem.common.transport import close_monitor


def _exchange_works(ctx: zmq.Context, folder: Path, name: str) -> bool:
    """Whether a fresh ROUTER / DEALER pair over ipc in ``ctx`` (whose connection the
    context's I/O thread makes) passes one message within 2 s."""
    a, b = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    try:
        a.linger = b.linger = 0
        a.bind(f"ipc://{folder}/{name}.sock")
        b.connect(f"ipc://{folder}/{name}.sock")
        b.send(b"ping")
        return bool(a.poll(2000))
    finally:
        a.close()
        b.close()


def _after_the_peer_goes(tmp_path: Path, stop_first: bool) -> bool:
    ctx = zmq.Context()
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    router.linger = dealer.linger = 0
    router.bind(f"ipc://{tmp_path}/r.sock")
    dealer.connect(f"ipc://{tmp_path}/r.sock")
    addr = f"inproc://test-monitor-{uuid.uuid4().hex}"
    monitor = dealer.get_monitor_socket(zmq.EVENT_DISCONNECTED, addr=addr)
    dealer.send(b"hello")
    assert router.poll(2000)
    router.recv_multipart()
    if stop_first:
        close_monitor(dealer, monitor)
    else:
        monitor.close(linger=0)  # the reading end alone
    router.close()  # the peer goes: the dealer's connection drops, an event is due
    time.sleep(0.3)
    works = _exchange_works(ctx, tmp_path, "after")
    rescue = ctx.socket(zmq.PAIR)  # a reader for an event still waiting, if any
    rescue.connect(addr)
    rescue.poll(500)
    rescue.close(linger=0)
    dealer.close()
    ctx.term()
    return works


def test_close_monitor_keeps_the_context_working_after_the_peer_goes(tmp_path: Path) -> None:
    assert _after_the_peer_goes(tmp_path, stop_first=True)


def test_closing_only_the_monitor_s_reader_stalls_the_whole_context(tmp_path: Path) -> None:
    """The hazard close_monitor exists for, in the installed libzmq: if this ever
    passes, libzmq no longer blocks on a monitor event (the order still costs nothing)."""
    assert not _after_the_peer_goes(tmp_path, stop_first=False)


@pytest.fixture
def flapper() -> Iterator[tuple[int, list[int], threading.Event]]:
    """A TCP port whose listener accepts each connection and closes it at once: a
    ZeroMQ peer there connects, loses the connection, reconnects, ... (a disconnect
    event each time, as with a router that refuses its keys). Yields (port, [count],
    stop): set ``stop`` and the listener closes (then connects are refused: no event)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(128)
    srv.settimeout(0.1)
    count, stop = [0], threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            conn.close()
            count[0] += 1

        srv.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield srv.getsockname()[1], count, stop
    stop.set()
    thread.join(5)


def _until(count: list[int], n: int, timeout_s: float) -> None:
    """Until ``n`` connections were accepted, ``timeout_s`` passed, or none came for 1 s."""
    deadline = time.monotonic() + timeout_s
    last, since = count[0], time.monotonic()
    while count[0] < n and time.monotonic() < deadline and time.monotonic() - since < 1.0:
        time.sleep(0.05)
        if count[0] != last:
            last, since = count[0], time.monotonic()


def test_a_monitor_nobody_reads_stalls_the_whole_context_once_its_queue_fills(
    tmp_path: Path, flapper: tuple[int, list[int], threading.Event]
) -> None:
    """Why an idle sync Client must not keep a monitor: ~2,000 unread events (the
    monitor pipe's two high-water marks) and the I/O thread blocks on the next one."""
    port, count, stop = flapper
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.linger = 0
    dealer.reconnect_ivl = 1
    addr = f"inproc://test-monitor-{uuid.uuid4().hex}"
    monitor = dealer.get_monitor_socket(zmq.EVENT_DISCONNECTED, addr=addr)
    dealer.connect(f"tcp://127.0.0.1:{port}")
    _until(count, 2500, 20.0)
    stalled_at = count[0]
    works = _exchange_works(ctx, tmp_path, "full")
    stop.set()  # no new connection, no new event
    time.sleep(0.3)
    while monitor.poll(300):  # read the queue: the I/O thread goes on
        monitor.recv_multipart()
    close_monitor(dealer, monitor)
    dealer.close()
    ctx.term()
    assert stalled_at < 2500, "the flapping peer never filled the monitor's queue"
    assert not works


def test_an_idle_sync_client_keeps_no_monitor_queue(
    flapper: tuple[int, list[int], threading.Event],
) -> None:
    """A Client idling against a peer that drops every connection (reconnecting every
    millisecond here) leaves the process's context working: it watches its connection
    only while a reply is awaited. Run in a child process: a stall must not take the
    test session's shared context with it."""
    port, count, _ = flapper
    script = textwrap.dedent(
        f"""
        import os, time, zmq
        import tandem.client.sync as sync
        def fast(sock):
            sock.reconnect_ivl = 1
        sync.peer_setup = lambda keys, role: fast
        client = sync.Client(address="tcp://127.0.0.1:{port}")
        time.sleep(6.0)  # ~1 ms a reconnect: far more events than a monitor queue holds
        ctx = zmq.Context.instance()
        a, b = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
        a.linger = b.linger = 0
        port = a.bind_to_random_port("tcp://127.0.0.1")
        b.connect(f"tcp://127.0.0.1:{{port}}")
        b.send(b"ping")
        print("works" if a.poll(3000) else "stalled", flush=True)
        os._exit(0)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "works", f"{out.stdout} {out.stderr} ({count[0]} reconnects)"
    assert count[0] > 2500, f"the child reconnected only {count[0]} times: {out.stderr}"
