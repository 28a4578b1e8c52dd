"""The router's decisions, sans-IO: events in, each with its time; messages out.

``RouterCore`` is everything the router decides — who is registered, what each
worker holds, which worker gets a request, what each peer is owed — and nothing
of how frames move: no socket, no clock, no thread. Each event carries ``now``:

- from clients: ``client(identity, msg, now)`` (Hello, Submit, Cancel,
  StatusQuery, or a refused frame);
- from workers: ``worker_frame(identity, frame, now)``, a frame as it came off the
  wire (a heartbeat byte for byte the last is not decoded, ``repeated_heartbeat``;
  anything else is, and handled as ``worker(identity, msg, now)``: Ready,
  Heartbeat, tokens, Done, Error, Goodbye, batches of these), ``drained()`` after
  a run of frames read together;
- from the driver: ``tick(now)`` (liveness), ``disconnected`` / ``probe`` (a
  connection closed), ``tokenized()`` (prompts done beside the loop).

What the router owes its peers collects in ``out`` (broker/outgoing.py) as
(peer, messages) and decision records. ``flush(peers, now)`` is the one sequence
that hands it over: workers first, held Accepteds that are due, clients, what
could not be delivered fed back (``assigns_lost``, ``client_gone``), decision
records, then the metrics hooks (``settle``) once the frames they count have
left; ``route_and_flush(peers, now, limit)`` is a routing pass (``dispatch``)
and that flush. The driver passes its I/O as ``peers`` (outgoing.py ``Peers``);
every driver calls these two and none restates their steps. Three drivers run
this one core: the live loop (broker/router.py, ZeroMQ sockets and the monotonic
clock), the twin (twin/loop.py, a virtual clock) and the router study
(studies/router_state.py); the tests drive the live loop over inproc sockets
(tests/helpers.py) and the core directly (tests/replay_links.py).
"""

from __future__ import annotations

from tandem.broker.admission import prompt_units
from tandem.broker.membership import Membership
from tandem.broker.outgoing import Peers
from tandem.broker.requests import ClientRequest, validate_submit
from tandem.broker.routing import Routing
from tandem.common import protocol as p


class RouterCore(Membership, Routing):
    """The router's state and decisions; see the module docstring."""

    def worker_frame(self, identity: bytes, frame: bytes, now: float) -> None:
        """One frame from the worker connected as ``identity``, as it came off the wire,
        at ``now``: the live loop and the twin both read a worker's frames here."""
        if self.repeated_heartbeat(identity, frame, now):
            return
        try:
            msg: p.Message | p.ProtocolError = p.decode(frame)
        except p.ProtocolError as exc:  # refused to the worker, as a bad frame is
            msg = exc
        self.worker(identity, msg, now)
        if isinstance(msg, p.Heartbeat):
            self.heartbeat_bytes(identity, frame)

    def flush(self, peers: Peers, now: float) -> None:
        """Hand ``peers`` what the core owes, at ``now``: workers first, so that a request
        whose Assign did not leave is queued again before its client is told it was
        accepted; what a departed client leaves behind (Cancels to its workers) goes
        in the same flush. Most calls find nothing owed: no call to ``peers`` then."""
        out = self.out
        # A pass may leave more owed (a departed client's Cancels, a lost worker's
        # failed requests); what is still owed after three goes with the next flush.
        for _ in range(3):
            if out.workers:
                for identity, lost in peers.to_workers(out.take_workers(), now):
                    self.assigns_lost(identity, lost, now)
            if self.accepts:
                self.release_accepts(now)
            if not out.clients:
                break
            for identity, lost in peers.to_clients(out.take_clients(), now):
                self.client_gone(identity, lost)
            if not out.workers:
                break
        if out.decisions:
            peers.write_decisions(out.take_decisions(), now)
        if self.settling:
            self.settle()

    def route_and_flush(self, peers: Peers, now: float, limit: int | None = None) -> bool:
        """Route waiting requests in order (``dispatch``), then ``flush``; True when
        ``limit`` routes left some behind."""
        try:
            return bool(self.pending) and self.dispatch(now, limit)
        finally:
            self.flush(peers, now)

    def client(self, identity: bytes, msg: p.Message | p.ProtocolError, now: float) -> None:
        """A message from the client connected as ``identity``, handled at ``now``."""
        reply = self.out.to_client
        if isinstance(msg, p.ProtocolError):
            self.refusals.refused(msg.reason, "rejected client frame (%s): %s", msg.reason,
                                  msg.message)  # fmt: skip
            self.metrics.on_rejected("client", msg.reason)
            reply(identity, p.Error(msg.code, msg.message, msg.request_id))
        elif isinstance(msg, p.Hello):
            reply(identity, self._welcome())
        elif isinstance(msg, p.Submit):
            self.submit(identity, msg, now)
        elif isinstance(msg, p.Cancel):
            self.cancel(identity, msg.request_id)
        elif isinstance(msg, p.StatusQuery):
            reply(identity, self.status(now))
        else:
            reply(identity, p.Error(p.BAD_REQUEST, f"clients may not send {msg.TYPE!r}"))

    def status(self, now: float) -> p.StatusReply:
        ordered = sorted(self.workers.values(), key=lambda w: w.id)
        rows = self.status_rows.rows(ordered, self.cfg.calibrate, now)
        return p.StatusReply(
            self.policy.name, rows, len(self.requests), len(self.pending), self.metrics.activity(),
            starting=self.starting.rows(now, self.workers),
        )  # fmt: skip

    def submit(self, identity: bytes, msg: p.Submit, now: float) -> None:
        """A request joins the pending queue (routed by ``dispatch``), or is refused."""
        key = (identity, msg.request_id)
        problem = validate_submit(msg) or self.admission.prompt_problem(msg)
        tokenizing = self.tokenizing
        if problem is None and (key in self._by_client or key in self.pending or key in tokenizing):
            problem = p.Problem(
                p.DUPLICATE_REQUEST, f"request id {msg.request_id!r} is already in flight"
            )
        if problem is None:  # prompts being tokenized wait as the pending ones do
            units = prompt_units(msg) + self.pending.units + tokenizing.units
            problem = self.admission.full_problem(len(self.pending) + len(tokenizing), units)
        if problem:
            self.out.to_client(identity, self.admission.error(problem, msg, len(self.pending)))
            return
        req = ClientRequest(identity, msg, now)
        req.deadline = now + self.cfg.no_worker_wait_s
        if not (msg.worker or msg.sampling.prefill_only):  # traffic, not a pin or a seed
            req.earlier_arrivals = self.arrivals.record(now)
        self.pending.append(req)

    def cancel(self, identity: bytes, request_id: str) -> None:
        """Stop a request wherever it is; a request unknown or finished: nothing."""
        wid = self._by_client.get((identity, request_id))
        if wid is not None:
            req = self.requests[wid]
            self.out.to_worker(self.workers[req.worker_id or ""].identity, p.Cancel(wid))
            return
        tokenizing = self.tokenizing.cancel((identity, request_id))
        if tokenizing is not None:  # its tokens, when they come, are dropped
            self._cancelled(tokenizing)
            return
        for req in list(self.pending):
            if (req.client, req.submit.request_id) == (identity, request_id):
                self.pending.remove(req)
                self._cancelled(req)

    def _cancelled(self, req: ClientRequest) -> None:
        done = p.Done(req.submit.request_id, p.FinishReason.CANCELLED)
        self.out.to_client(req.client, done)
        self.metrics.on_outcome(req.policy, "cancelled")

    def client_gone(self, identity: bytes, lost: list[p.Message]) -> None:
        """Messages ``identity`` could not be sent (it left, or stopped reading): stop
        spending workers on its requests."""
        for msg in lost:
            wid = self._by_client.get((identity, getattr(msg, "request_id", None) or ""))
            req = self.requests.get(wid) if wid else None
            if req is None:
                continue
            w = self.workers.get(req.worker_id or "")
            if w is not None:
                self.out.to_worker(w.identity, p.Cancel(wid or ""))
                self._forget(w, req)
            self.metrics.on_outcome(req.policy, "client_gone")
