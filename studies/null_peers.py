"""The processes around a router under test, none of them doing real work.

- ``null_worker``: answers every request at once: ``max_tokens`` steps, each one
  frame with a token for every running request and the Dones of those that ended
  (as a real worker's I/O thread sends a step, workers/io.py). It speaks to a tandem
  router (Ready, Assign), a plain relay or a client directly (Submit): the same
  bytes in every mode, so the router's own cost is what differs.
- ``plain_relay``: the floor a relay in Python can reach: two ROUTER sockets,
  frames forwarded as bytes, one worker and one client, nothing decoded.
- ``heartbeat_swarm``: many idle workers that register and heartbeat on a period.

Each runs in its own process until its ``stop`` event is set.
"""

from __future__ import annotations

import time
from typing import Any

import msgpack
import zmq
from tokenizers import Tokenizer, models

from tandem.common import protocol as p
from tandem.common.tokenizer import TokenizerSpec

HEARTBEAT_S = 0.5


def tiny_spec() -> dict[str, Any]:
    """A small valid tokenizer: registration is not what these benches measure."""
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(1000)}, unk_token="t0"))
    return TokenizerSpec(tok.to_str(), None, (0,), None, False).to_wire()


_HASHES: dict[int, str] = {}  # id(spec) -> its hash: hashing 1.5 MB is not free


def ready(worker_id: str, spec: dict[str, Any], with_spec: bool = True) -> p.Ready:
    """A Ready for a null worker; ``with_spec`` False sends only the spec's hash
    (when this protocol version has one) and waits to be asked for the spec."""
    fields = set(p.Ready.__struct_fields__)
    extra: dict[str, Any] = {}
    if "tokenizer_hash" in fields:
        if id(spec) not in _HASHES:
            _HASHES[id(spec)] = p.tokenizer_hash(spec)
        extra["tokenizer_hash"] = _HASHES[id(spec)]
    body = spec if with_spec or not extra else {}
    return p.Ready(worker_id, "null", "null", "null.gguf", 256, 1 << 20, 16, 1e6,
                   [1e4] * 8, HEARTBEAT_S, body, 1 << 20, **extra)  # fmt: skip


def _resend(msg: dict[str, Any]) -> bool | None:
    """For a Reregister: whether to send the spec (always, where the protocol has no
    hash); None for anything else."""
    if msg.get("type") != "reregister":
        return None
    return bool(msg.get("tokenizer", True))


def null_worker(address: str, mode: str, stop: Any) -> None:
    """``mode``: "router" (connect, Ready, Assign), "relay" (connect, Submit) or
    "direct" (bind, Submit)."""
    sock: zmq.Socket = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 0)
    spec = tiny_spec()
    if mode == "direct":
        sock.bind(address)
    else:
        sock.connect(address)
        # The relay learns the worker's identity from an empty frame; a router from Ready.
        sock.send(p.encode(ready("null", spec, with_spec=False)) if mode == "router" else b"")
    active: dict[str, list[Any]] = {}  # request id -> [tokens left, token frame]
    while not stop.is_set():
        if sock.poll(0 if active else 100):
            for _ in range(1024):
                try:
                    frame = sock.recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
                msg = msgpack.unpackb(frame)
                # A router sends a turn's Assigns as one batch (protocol 5).
                for m in msg["messages"] if msg.get("type") == "batch" else [msg]:
                    if m.get("type") in ("assign", "submit"):
                        rid, n = m["request_id"], max(1, m["sampling"]["max_tokens"])
                        active[rid] = [n, p.TokenDelta(rid, [7], "x")]
                    elif _resend(m) is not None:
                        sock.send(p.encode(ready("null", spec, with_spec=bool(_resend(m)))))
        if not active:
            continue
        # One step: a token for every active request, then the Dones, in one frame as a
        # worker's I/O thread sends what the engine emitted together (workers/io.py).
        rids = list(active)
        if len(rids) == 1:
            tokens = active[rids[0]][1]
        else:
            n = len(rids)
            tokens = p.StepTokens(rids, [[7]] * n, ["x"] * n)
        dones = []
        for rid in rids:
            state = active[rid]
            state[0] -= 1
            if state[0] == 0:
                del active[rid]
                stats = p.DoneStats(output_tokens=1, prompt_tokens=1, cached_tokens=0)
                dones.append(p.Done(rid, p.FinishReason.LENGTH, stats))
        sock.send(p.encode_batch([tokens, *dones]) if dones else p.encode(tokens))
    sock.close(0)


def plain_relay(front: str, back: str, stop: Any) -> None:
    """Forward client frames to the one worker and worker frames to the last client."""
    ctx: zmq.Context = zmq.Context.instance()
    fs, bs = ctx.socket(zmq.ROUTER), ctx.socket(zmq.ROUTER)
    for s, addr in ((fs, front), (bs, back)):
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.SNDHWM, 0)
        s.bind(addr)
    poller = zmq.Poller()
    poller.register(fs, zmq.POLLIN)
    poller.register(bs, zmq.POLLIN)
    worker = client = None
    while not stop.is_set():
        events = dict(poller.poll(100))
        if bs in events:
            for _ in range(1024):
                try:
                    worker, frame = bs.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                if client is not None and frame:  # empty: the worker saying hello
                    fs.send_multipart([client, frame])
        if fs in events and worker is not None:
            for _ in range(1024):
                try:
                    client, frame = fs.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                bs.send_multipart([worker, frame])
    fs.close(0)
    bs.close(0)


def heartbeat_swarm(address: str, n_workers: int, spec: dict[str, Any], stop: Any) -> None:
    """``n_workers`` idle workers: Ready (the spec only when asked, where the
    protocol allows), then, once welcomed, an empty heartbeat every HEARTBEAT_S
    each (as a real worker: none before its Welcome)."""
    ctx: zmq.Context = zmq.Context.instance()
    # A context holds 1,023 sockets by default: a swarm of 1,024 needs more (set
    # before its first socket).
    ctx.set(zmq.MAX_SOCKETS, max(ctx.get(zmq.MAX_SOCKETS), n_workers + 16))
    socks = []
    for i in range(n_workers):
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.IDENTITY, f"swarm-{i}".encode())
        s.connect(address)
        s.send(p.encode(ready(f"swarm-{i}", spec, with_spec=False)))
        socks.append(s)
    seq = [0] * n_workers
    welcomed = [False] * n_workers
    # Ready again while not welcomed, backing off as workers/io.py does (0.25 s doubling to 5 s)
    backoff_s = [0.25] * n_workers
    retry_at = [time.monotonic() + 0.25] * n_workers
    due = [time.monotonic() + HEARTBEAT_S * i / n_workers for i in range(n_workers)]
    while not stop.is_set():
        now = time.monotonic()
        for i, s in enumerate(socks):
            while True:
                try:
                    msg = msgpack.unpackb(s.recv(zmq.NOBLOCK))
                except zmq.Again:
                    break
                welcomed[i] = welcomed[i] or msg.get("type") == "welcome"
                with_spec = _resend(msg)
                if with_spec is not None:
                    welcomed[i] = False
                    s.send(p.encode(ready(f"swarm-{i}", spec, with_spec=with_spec)))
            if not welcomed[i] and now >= retry_at[i]:
                backoff_s[i] = min(5.0, backoff_s[i] * 2)
                retry_at[i] = now + backoff_s[i]
                s.send(p.encode(ready(f"swarm-{i}", spec, with_spec=False)))
            if welcomed[i] and now >= due[i]:
                due[i] = max(due[i] + HEARTBEAT_S, now)
                if seq[i] == 0:  # the first report is a full (empty) listing, then no changes
                    seq[i], cache = 1, p.CacheReport(full=True, seq=1)
                else:  # nothing new: the same seq and bytes each time, as an idle worker's
                    seq[i] = 2
                    cache = p.CacheReport(full=False, base=1, seq=1)
                hb = p.Heartbeat(f"swarm-{i}", seq[i], [], [], 0, 1 << 20, cache)
                s.send(p.encode(hb))
        time.sleep(0.01)
    for s in socks:
        s.close(0)
