"""A socket monitor's reading end must not close before the monitor is stopped.

libzmq sends monitor events from the context's I/O thread with a blocking send: an
event for a monitor whose reader is gone blocks that thread, and with it every
socket of the context. Each test here runs in a context of its own (never the
process's shared one), and gives a blocked event a reader before it ends, so that
the context can terminate."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

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
