"""The router core's state, and the few steps every kind of event ends with.

``CoreState`` holds what the router knows (workers, requests, the pending
queue, the ledger's views, calibration, admission, liveness, metrics) and what
it owes (``out``, broker/outgoing.py). broker/membership.py (worker events),
broker/routing.py (placing requests) and broker/core.py (client events) build
on it; ``RouterCore`` is the three together. Nothing here reads a clock, opens a
socket or starts a thread: times come in with the events.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

from tandem.broker.admission import Admission, prompt_units
from tandem.broker.arrivals import ArrivalLog
from tandem.broker.calibration import Calibration
from tandem.broker.config import RouterConfig
from tandem.broker.identity import RequestIds
from tandem.broker.ledger import ViewCache
from tandem.broker.liveness import Liveness
from tandem.broker.metrics import RouterMetrics
from tandem.broker.offload import Inline, Offload
from tandem.broker.outgoing import Outgoing
from tandem.broker.policies import parse_policy
from tandem.broker.registry import Claims, WorkerState
from tandem.broker.relay import Pending, TokenOutbox
from tandem.broker.requests import ClientRequest, PendingQueue, PromptTokenizer
from tandem.broker.starting import StartingList
from tandem.broker.statusrows import StatusRows
from tandem.common import protocol as p
from tandem.common.refusals import RefusalLog

log = logging.getLogger("tandem.broker.router")


def no_clock() -> float:
    """The clock of a driver that times nothing (the twin, most tests): always 0. The
    live loop passes the process's clocks; the core reads none of its own."""
    return 0.0


class CoreState:
    """What the router knows and owes; see the module docstring."""

    # Declared here, set in __init__ and by worker events (broker/membership.py).
    tokenizer: PromptTokenizer | None
    tokenizer_hash: str
    model: str | None
    weights: str
    _spec_asked_at: float
    _expiry_at: float

    def __init__(
        self,
        cfg: RouterConfig,
        *,
        tokenizer: PromptTokenizer | None = None,
        offload: Offload | None = None,
        epoch: str | None = None,
        cost_clock: Callable[[], float] = no_clock,
        wall_clock: Callable[[], float] = no_clock,
    ) -> None:
        self.cfg = cfg
        self.policy = parse_policy(cfg.policy)
        self.workers: dict[str, WorkerState] = {}
        self.starting = StartingList(cfg.liveness_s)  # announced, not yet registered
        self.requests: dict[str, ClientRequest] = {}  # by worker-side id
        self.pending = PendingQueue(prompt_units)  # for any worker, routed in order
        # The first worker's tokenizer becomes the router's; a driver that only ever
        # submits token ids (the twin) may give one that only knows the vocabulary.
        self.tokenizer: PromptTokenizer | None = tokenizer
        self.tokenizer_hash: str = ""
        self.model: str | None = None
        self.weights: str = ""  # the first worker's weights digest ("" unknown)
        self.admission = Admission(cfg.admission)
        self.liveness = Liveness(cfg.no_progress_s)
        self.ids = RequestIds() if epoch is None else RequestIds(epoch)
        self.log_decisions = bool(cfg.decision_log)  # records go out with the messages
        self.calibration = Calibration(cfg.calibrate, cfg.decode_estimate)
        self.arrivals = ArrivalLog()  # client requests' arrival times (broker/arrivals.py)
        self.metrics = RouterMetrics(
            lambda: (len(self.workers), len(self.requests), len(self.pending)), wall_clock
        )
        self.views = ViewCache(self.calibration)
        self.status_rows = StatusRows()  # status rows kept while their worker is unchanged
        self.outbox = TokenOutbox()
        self.refusals = RefusalLog(log)  # refused frames and handling failures, rate-limited
        # Large prompts tokenized beside the loop (its thread pool is the driver's);
        # without one, every prompt is tokenized as it is routed.
        self.tokenizing: Offload = offload if offload is not None else Inline()
        # A decision's cost for /metrics, on the CPU's clock: it never decides anything.
        self.cost_clock = cost_clock
        self.out = Outgoing()
        self._by_client: dict[tuple[bytes, str], str] = {}
        self._by_identity: dict[bytes, str] = {}  # worker socket identity -> worker id
        self._claims = Claims()  # Readies for a worker id another connection holds
        self._hb_frames: dict[bytes, bytes] = {}  # identity -> its last heartbeat's bytes
        # Accepteds held until their request's first output or their time (oldest first);
        # a driver tests it before ``release_accepts``, as it tests ``settling`` before
        # ``settle`` (most passes find both empty: no call then).
        self.accepts: dict[str, tuple[ClientRequest, p.Accepted, float]] = {}
        # Metrics hooks run after the frames they count have left (``settle``): at low
        # load they otherwise sat between a request and its worker, both ways.
        self.settling: list[tuple[Any, tuple[Any, ...]]] = []
        self._expiry_at: float = 0.0  # when the next liveness walk is due (membership.tick)
        self._spec_asked_at: float = -math.inf  # when a worker was last asked for the tokenizer

    def settle(self) -> None:
        """Run the metrics hooks of what has been handed over since the last call."""
        if self.settling:
            settle, self.settling = self.settling, []
            for hook, args in settle:
                hook(*args)

    # ------------------------------------------------------------ shared steps
    def _forget(self, w: WorkerState, req: ClientRequest) -> None:
        self._release_accept(req.wid or "")  # before whatever ends (or moves) the request
        pending = self.outbox.pop(req.wid or "")
        if pending is not None:  # its tokens go out before whatever ends the request
            self._send_tokens(pending)
        w.untrack(req.wid or "")
        self.requests.pop(req.wid or "", None)
        self._by_client.pop((req.client, req.submit.request_id), None)

    def _release_accept(self, wid: str) -> None:
        """``wid``'s Accepted, if still held, goes first in what its client gets next."""
        held = self.accepts.pop(wid, None)
        if held is not None:
            self.out.to_client(held[0].client, held[1])

    def _send_tokens(self, pending: Pending) -> None:
        req = pending.req
        self._release_accept(req.wid or "")  # with its first tokens, in one frame
        delta = p.TokenDelta(req.submit.request_id, pending.token_ids, pending.text,
                             pending.logprobs)  # fmt: skip
        self.out.to_client(req.client, delta)  # a client gone: client_gone

    def _send_buffered(self, req: ClientRequest) -> None:
        """stream=False: the whole output in one TokenDelta, just before the Done."""
        if not req.submit.stream and req.output_ids:
            text = "".join(req.buffer_text)
            delta = p.TokenDelta(req.submit.request_id, req.output_ids, text, req.buffer_logprobs)
            self.out.to_client(req.client, delta)

    def _finish_migrated(self, req: ClientRequest, now: float) -> None:
        """A request whose worker died after its last token but before its Done."""
        self._send_buffered(req)
        stats = req.final_stats(p.DoneStats(output_tokens=0), now, req.policy)
        self.out.to_client(req.client, p.Done(req.submit.request_id, p.FinishReason.LENGTH, stats))

    def _fail(self, req: ClientRequest, code: p.ErrorCode, message: str) -> None:
        self.out.to_client(req.client, p.Error(code, message, req.submit.request_id))
        self.metrics.on_outcome(req.policy, code)

    def _welcome(self) -> p.Welcome:
        return p.Welcome(policy=self.policy.name, epoch=self.ids.epoch)

    def _worker_by_identity(self, identity: bytes) -> WorkerState | None:
        wid = self._by_identity.get(identity)
        return self.workers.get(wid) if wid is not None else None
