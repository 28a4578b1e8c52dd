"""The router's loop on the twin's virtual clock: the live router core, driven by events.

The twin has no router of its own: ``TwinLoop`` feeds the very ``RouterCore``
the router process runs (broker/core.py) the events the live loop would
(broker/router.py), with the world's time: a client's Submit, then a routing
pass; the frames one worker's link sent after one step (workers/frames.py, the
encoder a real worker's I/O thread runs), read as the live loop reads them, then
the end of that drain and a routing pass (capacity may have freed). What the core
owes its peers leaves through the core's one flush (``RouterCore.flush``), this
loop its ``Peers``: what a worker is owed is delivered to it after the link's
latency; what the client is owed becomes that request's bench ``RequestRecord``
(worker, token times, stats, errors), so the bench's statistics, reports and
plots apply as is.

Only the links differ from the live router: a worker's Welcome, Reregister or
Error is the I/O thread's business (workers/io.py), not the engine's, and the
twin's workers never fail to register; the twin submits token ids, so the core
is given a tokenizer that only knows how many ids there are.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tandem.bench.driver import RequestRecord
from tandem.broker.config import RouterConfig
from tandem.broker.core import RouterCore
from tandem.broker.outgoing import Held, Lost, Records
from tandem.common import protocol as p

Send = Callable[[str, p.Message, float], None]  # (worker id, message, time)
CLIENT = b"twin-client"  # the one client every twin request comes from
_ENGINE_MESSAGES = (p.Assign, p.Cancel, p.ResyncCache)  # what a worker's engine reads


class IdsOnly:
    """The core's tokenizer for a driver that submits token ids only."""

    vocab_size = 1 << 31

    def fewest_tokens(self, text: str) -> int:
        return 0

    def encode(self, text: str, *, release_gil: bool = False) -> list[int]:
        raise ValueError("the twin submits token ids, never text")

    def apply_chat_template(self, messages: list[dict[str, Any]]) -> str:
        raise ValueError("the twin submits token ids, never messages")


class TwinLoop:
    """Routes the twin's requests through ``RouterCore`` as the live loop does."""

    def __init__(
        self, policy: str, send: Send, calibrate: bool = True, decode_estimate: str = "budget"
    ) -> None:
        cfg = RouterConfig(policy=policy, calibrate=calibrate, decode_estimate=decode_estimate,
                           accept_hold_ms=0.0)  # fmt: skip
        self.core = RouterCore(cfg, tokenizer=IdsOnly(), epoch="twin")
        self.core.log_decisions = True  # records kept in memory (``decisions``), with their time
        self.send = send
        self.records: dict[str, RequestRecord] = {}  # by the client's request id
        self.pinned: set[str] = set()  # their decisions are not the policy's
        self.decisions: list[dict[str, Any]] = []
        self.ended = 0  # requests that ended (done or failed): the replay's stop condition

    def register(self, ready: p.Ready, now: float) -> None:
        self.core.worker(ready.worker_id.encode(), ready, now)
        self.core.flush(self, now)

    def submit(
        self, rec: RequestRecord, tokens: list[int], max_tokens: int, now: float, **kw: Any
    ) -> None:
        """Submit one request at ``now`` (``worker=`` pins it, ``prefill_only=`` seeds)."""
        rec.submit_s = now
        prefill_only = bool(kw.get("prefill_only", False))
        pinned = kw.get("worker")
        if pinned:
            self.pinned.add(rec.request_id)
        sampling = p.SamplingParams(max_tokens, ignore_eos=True, prefill_only=prefill_only)
        self.records[rec.request_id] = rec
        sub = p.Submit(rec.request_id, tokens=tokens, sampling=sampling, worker=pinned)
        self.core.client(CLIENT, sub, now)
        self.core.route_and_flush(self, now)  # no limit per pass: its turns take no time

    def on_worker(self, worker_id: str, frames: list[bytes], now: float) -> None:
        """The frames a twin worker's link sent after one step (workers/frames.py),
        delivered at ``now``: read as the live loop reads them (``worker_frame``)."""
        core, identity = self.core, worker_id.encode()
        for frame in frames:
            core.worker_frame(identity, frame, now)
        core.drained()
        core.route_and_flush(self, now)

    # ------------------------------------------------------------ Peers (broker/outgoing.py)
    def to_workers(self, held: Held, now: float) -> Lost:
        for identity, msgs in held.items():
            for msg in msgs:
                if isinstance(msg, _ENGINE_MESSAGES):
                    self.send(identity.decode(), msg, now)
        return []  # the twin's links lose nothing

    def to_clients(self, held: Held, now: float) -> Lost:
        for msgs in held.values():
            for msg in msgs:
                self._to_client(msg, now)
        return []

    def write_decisions(self, records: Records, now: float) -> None:
        self.decisions += [r | {"time": now} for _, r in records if r["request"] not in self.pinned]

    def _to_client(self, msg: p.Message, now: float) -> None:
        """What the client sees of its request, kept on its record."""
        rec = self.records.get(getattr(msg, "request_id", None) or "")
        if rec is None:
            return
        if isinstance(msg, p.Accepted):
            rec.worker = msg.worker_id
        elif isinstance(msg, p.TokenDelta):
            rec.token_s.extend([now] * len(msg.token_ids))
        elif isinstance(msg, p.Done | p.Error):
            del self.records[rec.request_id]
            rec.done_s, self.ended = now, self.ended + 1
            if isinstance(msg, p.Error):
                rec.error = f"{msg.code}: {msg.message}"
                return
            rec.finish_reason = msg.finish_reason
            rec.output_tokens = len(rec.token_s)
            rec.stats = msg.stats.as_dict()
