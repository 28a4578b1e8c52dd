"""Token deltas on their way to clients, coalesced per request within one drain.

A worker sends one delta per request per step. When the router falls behind,
several of a request's deltas wait in its socket at once; relaying each costs the
router (and the client) per message. The router instead collects a request's
deltas while it drains the worker socket and owes them as one TokenDelta at the
end of the drain (``RouterCore.drained``), or at once before anything that must
follow them (the request's Done or Error); the drain's end then sends each client
one frame (broker/router.py, ``_flush``). A drain reads only what is already queued, so a
delta waits for no new input: at low load it leaves as soon as it arrives.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tandem.broker.registry import WorkerState
from tandem.broker.requests import ClientRequest
from tandem.common import protocol as p


@dataclass
class Pending:
    """One request's tokens received this drain, not yet sent to its client."""

    worker: WorkerState
    req: ClientRequest
    token_ids: list[int] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    logprobs: list[p.TokenLogprob] | None = None  # when the request asked for them

    @property
    def text(self) -> str:
        return "".join(self.texts)


class TokenOutbox:
    """Pending token deltas by worker-side request id."""

    def __init__(self) -> None:
        self.pending: dict[str, Pending] = {}

    def add(
        self,
        worker: WorkerState,
        req: ClientRequest,
        ids: list[int],
        text: str,
        logprobs: list[p.TokenLogprob] | None = None,
    ) -> None:
        wid = req.wid or ""
        entry = self.pending.get(wid)
        if entry is None:
            entry = self.pending[wid] = Pending(worker, req)
        entry.token_ids.extend(ids)
        entry.texts.append(text)
        if logprobs is not None:  # relayed unchanged, joined as their tokens are
            if entry.logprobs is None:
                entry.logprobs = []
            entry.logprobs.extend(logprobs)

    def pop(self, wid: str) -> Pending | None:
        """Take ``wid``'s pending tokens (to send them before its Done or Error)."""
        return self.pending.pop(wid, None)

    def take_all(self) -> list[Pending]:
        """Every pending entry, in arrival order; the outbox is empty after."""
        if not self.pending:
            return []
        out = list(self.pending.values())
        self.pending.clear()
        return out
