"""The reported frame (a value nested 1,000 deep in ``hello``'s ``v``) on both of a
real router's sockets: refused, counted by reason, and the router still serves."""

from __future__ import annotations

import urllib.request

import zmq

from tandem.common import protocol as p
from tandem.launcher.cluster import Cluster, WorkerSpec, free_tcp_port

DEEP = b"\x82\xa1v" + b"\x91" * 1000 + b"\x01" + b"\xa4type\xa5hello"
SIM = ["--backend", "sim", "--profile", "gpu-m2", "--warmup", "off", "--heartbeat-s", "0.2"]


def refused_reply(addr: str, frame: bytes) -> p.Message:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(addr)
    try:
        sock.send(frame)
        assert sock.poll(10_000), "no reply: the router did not answer"
        return p.decode(sock.recv())
    finally:
        sock.close()


def rejected(url: str, source: str, reason: str) -> float:
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    series = f'tandem_frames_rejected_total{{reason="{reason}",source="{source}"}} '
    return next((float(x.split()[-1]) for x in text.splitlines() if x.startswith(series)), 0.0)


def test_a_deep_frame_on_either_socket_is_refused_and_the_router_serves_on():
    port = free_tcp_port()
    router = ["--metrics-port", str(port)]
    url = f"http://127.0.0.1:{port}/metrics"
    with Cluster(workers=[WorkerSpec("w", SIM)], router_args=router, transport="tcp") as cl:
        for addr in (cl.client_addr, cl.worker_addr):
            reply = refused_reply(addr, DEEP)
            assert isinstance(reply, p.Error) and reply.code == p.BAD_FRAME
            assert "deeper" in reply.message
        assert cl.procs["router"].poll() is None
        with cl.client(timeout_s=20.0) as c:
            result = c.generate(tokens=[1, 2, 3], max_tokens=3, ignore_eos=True)
        assert result.worker == "w" and len(result.token_ids) == 3
        assert rejected(url, "client", "too_deep") == 1
        assert rejected(url, "worker", "too_deep") == 1
