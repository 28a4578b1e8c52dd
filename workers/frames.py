"""A worker's messages to the router as the frames that carry them: the one encoder.

The engine emits messages one at a time (token deltas, Dones, Errors, heartbeats);
what reaches the router is fewer frames, since the router's cost is per frame: the
deltas found waiting together leave as one TokenDelta (one delta) or StepTokens;
with anything else among them, as one batch whose entries keep the order (a Done
never overtakes its tokens); a heartbeat as a frame of its own, after what came
before it. ``entry`` sorts a message into the kind ``Frames`` takes, and ``Frames``
makes the frames and hands each to a sender. Neither knows a socket, a thread or a
clock, so the worker's I/O thread (workers/io.py ``WorkerLink``) and the twin's
workers (twin/world.py) both send through them: a change to a real token's path
shows in the twin.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tandem.common import protocol as p

TOKENS, MESSAGE, HEARTBEAT = b"tok", b"msg", b"hb"  # the kinds ``entry`` sorts into
MAX_COALESCED = 1024  # token deltas per StepTokens frame (protocol bound: 4096)
MAX_BATCH = 256  # entries per batch frame (protocol bound: 4096; each <= 64 KiB of tokens)

# A token delta as fields: (request id, token ids, text), and its logprobs as plain
# tuples (id, token, logprob, top) when the request asked for them.
Delta = tuple[str, list[int], str] | tuple[str, list[int], str, list[list[Any]]]
Send = Callable[[bytes], None]


def entry(msg: p.Message) -> tuple[bytes, Any]:
    """``msg`` as ``Frames.put`` takes it, (kind, body): a token delta's fields (the
    worker's link packs them to cross its thread pipe), a heartbeat's own frame, or
    anything else packed as a batch entry."""
    if isinstance(msg, p.TokenDelta):
        return TOKENS, delta_fields(msg)
    if isinstance(msg, p.Heartbeat):
        return HEARTBEAT, p.encode(msg)
    return MESSAGE, p.batch_entry(msg)


class Frames:
    """What was found waiting, in order, until ``flush`` makes it frames for ``send``:
    token deltas alone as a TokenDelta or StepTokens; with anything else as a batch
    whose entries keep the order (consecutive deltas as one StepTokens entry). A
    heartbeat flushes what came before it and goes alone, to ``send_heartbeat``
    (``send`` unless given)."""

    def __init__(self, send: Send, send_heartbeat: Send | None = None) -> None:
        self.send = send
        self.send_heartbeat = send_heartbeat or send
        self.entries: list[bytes] = []  # packed by protocol.batch_entry
        self.deltas: list[Delta] = []

    def put(self, kind: bytes, body: Any) -> None:
        """One message as ``entry`` sorted it."""
        if kind == TOKENS:
            self.add_tokens(body)
        elif kind == MESSAGE:
            self.add(body)
        else:
            self.flush()
            self.send_heartbeat(body)

    def add_tokens(self, delta: Delta) -> None:
        self.deltas.append(delta)
        if len(self.deltas) >= MAX_COALESCED:
            self._close_deltas()

    def add(self, packed: bytes) -> None:
        self._close_deltas()
        self.entries.append(packed)
        if len(self.entries) >= MAX_BATCH:
            self.flush()

    def _close_deltas(self) -> None:
        if self.deltas:
            self.entries.append(p.batch_entry(token_frame(self.deltas)))
            self.deltas = []

    def flush(self) -> None:
        if self.deltas and not self.entries:  # tokens only: the plain token frame
            self.send(p.encode(token_frame(self.deltas)))
            self.deltas = []
            return
        self._close_deltas()
        if self.entries:
            self.send(p.join_batch(self.entries))
            self.entries = []


def encode(msgs: list[p.Message], send: Send, send_heartbeat: Send | None = None) -> None:
    """``msgs``, found waiting together, as the frames a worker's link sends."""
    frames = Frames(send, send_heartbeat)
    for msg in msgs:
        frames.put(*entry(msg))
    frames.flush()


def delta_fields(msg: p.TokenDelta) -> Delta:
    if msg.logprobs is None:
        return msg.request_id, msg.token_ids, msg.text
    lps = [[e.id, e.token, e.logprob, e.top] for e in msg.logprobs]
    return msg.request_id, msg.token_ids, msg.text, lps


def _logprobs(delta: Delta) -> list[p.TokenLogprob] | None:
    if len(delta) < 4:
        return None
    return [
        p.TokenLogprob(id=i, token=t, logprob=v, top=[tuple(x) for x in top])
        for i, t, v, top in delta[3]
    ]


def token_frame(deltas: list[Delta]) -> p.TokenDelta | p.StepTokens:
    """One frame for ``deltas`` (request id, token ids, text[, logprobs]), in order: a
    TokenDelta when there is one, else a StepTokens (its logprobs None when no delta
    has any)."""
    lps = [_logprobs(d) for d in deltas]
    if len(deltas) == 1:
        return p.TokenDelta(*deltas[0][:3], logprobs=lps[0])
    rids, ids, texts = (list(x) for x in zip(*(d[:3] for d in deltas), strict=True))
    asked = any(lp is not None for lp in lps)
    return p.StepTokens(rids, ids, texts, logprobs=lps if asked else None)
