"""The router core's worker events: who joins, what they report, who is given up.

A worker registers (Ready), heartbeats its load and cache, relays tokens and ends
requests (Done / Error), and leaves (Goodbye, silence, no progress, a connection
that closed). Each event comes with the time it is handled; what the router owes
in reply is appended to ``out`` (broker/outgoing.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat

from tandem.broker.identity import foreign_frame, takeover_problem
from tandem.broker.peerbounds import cache_limit_blocks, cache_overflow
from tandem.broker.registry import WorkerState, ready_problem

# Relative: mypy checks broker/ as files, and sees the core's base classes (so the
# attributes they declare) only through an import it can follow.
from tandem.broker.state import CoreState, log
from tandem.common import protocol as p
from tandem.common.tokenizer import TextTokenizer, TokenizerSpec

EXPIRE_EVERY_S = 0.1  # liveness is checked at most this often (it walks every worker)
SPEC_ASK_EVERY_S = 1.0  # a fresh router asks one worker per second for the tokenizer spec


class Membership(CoreState):
    def worker(self, identity: bytes, msg: p.Message | p.ProtocolError, now: float) -> None:
        """A message from the worker connected as ``identity``, handled at ``now``."""
        if isinstance(msg, p.Batch):  # what the worker's I/O thread found waiting together
            for entry in p.entries(msg):
                try:
                    self.worker(identity, entry, now)
                except Exception:  # as the loop does per frame: the other entries still count
                    self.refusals.note("router failed handling %s from %r", entry.__class__,
                                       identity, exc_info=True)  # fmt: skip
            return
        if isinstance(msg, p.ProtocolError):
            self.refusals.refused(msg.reason, "rejected worker frame from %r (%s): %s",
                                  identity, msg.reason, msg.message)  # fmt: skip
            self.metrics.on_rejected("worker", msg.reason)
            self.out.to_worker(identity, p.Error(msg.code, msg.message, msg.request_id))
            return
        if isinstance(msg, p.Ready):
            self.register(identity, msg, now)
            return
        if isinstance(msg, p.Starting):  # from its own connection: no identity to know
            self.announced(msg, now)
            return
        w = self._worker_by_identity(identity)
        if w is None:
            if not isinstance(msg, p.Goodbye):
                self.out.to_worker(identity, p.Reregister())
            return
        w.last_seen = now
        if isinstance(msg, p.Heartbeat):
            self._heartbeat(w, msg, now)
        elif isinstance(msg, p.StepTokens):  # several requests' deltas in one frame
            self.relay_tokens(w, msg.request_ids, msg.token_ids, msg.texts, now, msg.logprobs)
        elif isinstance(msg, p.TokenDelta):
            lps = None if msg.logprobs is None else (msg.logprobs,)
            self.relay_tokens(w, (msg.request_id,), (msg.token_ids,), (msg.text,), now, lps)
        elif isinstance(msg, p.Done | p.Error):
            self.relay(w, msg, now)
        elif isinstance(msg, p.Goodbye):
            self._drop_worker(w, "said goodbye", now)
        else:
            log.warning("worker %s sent unexpected %s", w.id, msg.TYPE)

    def _heartbeat(self, w: WorkerState, msg: p.Heartbeat, now: float) -> None:
        w.on_heartbeat(msg)
        self._note_progress(w, msg, now)
        problem = w.update_steps(msg.steps) if msg.steps is not None else None
        if problem:  # routing goes on with the last good model
            log.warning("worker %s sent an unusable step model: %s", w.id, problem)
        limit = cache_limit_blocks(msg, w.info.block_size)
        over = cache_overflow(w.cache, msg.cache, limit)
        if over is not None:  # refused whole: the last good listing stays
            self.refusals.refused(p.Refusal.OVER_CAPACITY, "worker %s: a cache report of %d "
                                  "blocks, past the %d it can hold: refused, resync asked",
                                  w.id, over, limit)  # fmt: skip
            self.metrics.on_rejected("worker", p.Refusal.OVER_CAPACITY)
            self.out.to_worker(w.identity, p.ResyncCache())
        elif not w.cache.apply(msg.cache, now):
            self.out.to_worker(w.identity, p.ResyncCache())
        self.metrics.on_heartbeat(w, w.rates(self.cfg.calibrate))

    def repeated_heartbeat(self, identity: bytes, frame: bytes, now: float) -> bool:
        """Whether ``frame`` is a registered worker's heartbeat, byte for byte its last
        one (an idle worker repeats its seq when nothing changed, workers/engine.py):
        then it is alive and has nothing new, so only liveness is noted and the frame
        need not be decoded. Most heartbeats of idle workers."""
        last = self._hb_frames.get(identity)
        if last is None or frame != last:
            return False
        w = self._worker_by_identity(identity)
        if w is None or w.heartbeat is None:
            del self._hb_frames[identity]
            return False
        w.last_seen = now
        self._note_progress(w, w.heartbeat, now)
        w.cache.expire(now)  # noted blocks run out on time, reported or not
        return True

    def heartbeat_bytes(self, identity: bytes, frame: bytes) -> None:
        """``frame`` was a heartbeat just handled: a repeat of it needs no decoding."""
        if identity in self._by_identity:
            self._hb_frames[identity] = frame

    def _note_progress(self, w: WorkerState, hb: p.Heartbeat, now: float) -> None:
        """Liveness learns the work ``hb`` lists (stuck workers list the same)."""
        remaining = sum(r.prefill_remaining + r.decode_remaining for r in hb.active + hb.queued)
        self.liveness.on_heartbeat(w.id, remaining, bool(w.inflight), now)

    def announced(self, msg: p.Starting, now: float) -> None:
        """A starting worker's announcement (broker/starting.py); one that crossed its
        own instance's Ready on the way is late, and dropped."""
        w = self.workers.get(msg.worker_id)
        if w is None or w.info.instance != msg.instance:
            self.starting.announce(msg.worker_id, msg.instance, device=msg.device,
                                   model=msg.model, stage=msg.stage, eta_s=msg.eta_s,
                                   every_s=msg.every_s, now=now)  # fmt: skip

    def register(self, identity: bytes, ready: p.Ready, now: float) -> None:
        self._hb_frames.pop(identity, None)  # a new registration starts from full reports
        if self.tokenizer is None and not ready.tokenizer and ready.tokenizer_hash:
            # Ask one worker at a time for the spec; the others' Readies go unanswered
            # and come back (workers retry until welcomed), by then hash-only suffices.
            if now - self._spec_asked_at >= SPEC_ASK_EVERY_S:
                self._spec_asked_at = now
                self.out.to_worker(identity, p.Reregister(tokenizer=True))
            return
        problem = ready_problem(ready, self.model, self.tokenizer is not None, self.weights)
        if problem:
            log.error("refusing worker %s: %s", ready.worker_id, problem.message)
            self.out.to_worker(identity, p.Error(problem.code, problem.message))
            self.starting.refused(ready.worker_id, ready.instance)
            return
        if self.tokenizer is None:
            self.tokenizer = TextTokenizer(TokenizerSpec.from_wire(ready.tokenizer))
            _ = self.tokenizer.max_piece_chars  # its bound now, with the tokenizer's own cost
            self.tokenizer_hash = ready.tokenizer_hash or p.tokenizer_hash(ready.tokenizer)
        elif ready.tokenizer_hash and ready.tokenizer_hash != self.tokenizer_hash:
            log.warning("worker %s names another tokenizer than the router's (same model %s)",
                        ready.worker_id, ready.model)  # fmt: skip
        if self.model is None:
            self.model, self.weights = ready.model, ready.weights
        # One tokenizer spec per router, not one per worker (1.5 MB each for SmolLM2).
        ready = p.replace(ready, tokenizer={})
        old = self.workers.get(ready.worker_id)
        if old is not None and old.identity == identity and old.info == ready:
            self.out.to_worker(identity, self._welcome())
            return  # a repeated Ready (our Welcome crossed it)
        if old is not None and self._held_by_another(identity, ready, old, now):
            return
        if old is not None:
            self._drop_worker(old, "re-registered", now)
        cap = self.cfg.admission.inflight_cap(ready.max_active)
        self.workers[ready.worker_id] = WorkerState(identity, ready, now, inflight_cap=cap)
        self._claims.first.pop(identity, None)
        self._by_identity[identity] = ready.worker_id
        self.starting.registered(ready.worker_id, ready.instance)
        log.info("worker %s joined: %s on %s, max_active %d", ready.worker_id, ready.backend,
                 ready.device, ready.max_active)  # fmt: skip
        self.out.to_worker(identity, self._welcome())

    def _held_by_another(
        self, identity: bytes, ready: p.Ready, old: WorkerState, now: float
    ) -> bool:
        """Whether ``ready`` claims the id of ``old``, a live worker on another
        connection: a duplicate is told so, a restart is left to retry its Ready."""
        silent_s = self.liveness.silent_for(old.last_seen, now)
        live = silent_s <= old.liveness_s(self.cfg.liveness_s)
        taken = takeover_problem(old.identity, identity, ready.worker_id, live)
        refused = taken and self._claims.refusal(identity, old, now)
        if refused:  # the holder spoke since this claim began: a duplicate, told so
            log.error("refusing worker %s from %r: %s", ready.worker_id, identity,
                      refused.message)  # fmt: skip
            self.out.to_worker(identity, p.Error(refused.code, refused.message))
            self.starting.refused(ready.worker_id, ready.instance)
            return True
        if taken:  # no reply: a restarted worker retries its Ready until the id is free
            log.warning("ignoring Ready from %r: %s", identity, taken.message)
            return True
        return False

    def relay_tokens(
        self,
        w: WorkerState,
        wids: Sequence[str],
        ids: Sequence[list[int]],
        texts: Sequence[str],
        now: float,
        logprobs: Sequence[list[p.TokenLogprob] | None] | None = None,
    ) -> None:
        """Token deltas from ``w`` (entry i: ``wids[i]``'s ``ids[i]`` and ``texts[i]``,
        and its ``logprobs[i]`` when any request asked), noted and held for their
        clients without a message object per delta (they go out at ``drained``); what
        is per worker is done once per frame."""
        relayed, n_tokens, requests = 0, 0, self.requests
        decode_n = prompt_n = firsts = 0  # the work they show (broker/observed.py)
        lps = repeat(None, len(wids)) if logprobs is None else logprobs
        for wid, token_ids, text, lp in zip(wids, ids, texts, lps, strict=True):
            req = requests.get(wid)
            if req is None:
                continue  # e.g. a late token after a cancel: nothing to relay to
            if foreign_frame(req.worker_id, w.id):
                log.warning("worker %s sent tokens for %s, assigned to %s: ignored",
                            w.id, wid, req.worker_id)  # fmt: skip
                continue
            req.on_tokens(token_ids, text, now, lp)
            relayed, n_tokens = relayed + 1, n_tokens + len(token_ids)
            routed = w.inflight.get(wid)
            if routed is not None:
                if routed.tokens_seen:
                    decode_n += len(token_ids)
                elif token_ids:  # its first: the prompt's work, then decode steps
                    decode_n, firsts = decode_n + len(token_ids) - 1, firsts + 1
                    prompt_n += max(1, routed.prompt_tokens - routed.cached_estimate)
                routed.tokens_seen += len(token_ids)
                w.progressed(wid)  # its decode budget shrank: recomputed at the next view
            if req.submit.stream:  # sent at the end of this drain, with any others of it
                self.outbox.add(w, req, token_ids, text, lp)
        if relayed:
            since = self._busy_since(w, now) if w.served.idle else None
            w.served_work(now, since, (decode_n, prompt_n, firsts), self.cfg.calibrate)
            self.liveness.on_output(w.id, now)
            # Counted once the tokens have left (settle), as the other metrics hooks.
            self.settling.append((self.metrics.on_tokens, (w.id, n_tokens)))

    def drained(self) -> None:
        """The frames waiting together have been handled: the token deltas they
        carried, coalesced per request, are owed to their clients now."""
        if self.outbox.pending:  # most drains relay none: no call then
            for pending in self.outbox.take_all():
                self._send_tokens(pending)

    def relay(self, w: WorkerState, msg: p.Done | p.Error, now: float) -> None:
        wid = msg.request_id
        req = self.requests.get(wid) if wid else None
        if req is not None and foreign_frame(req.worker_id, w.id):
            log.warning("worker %s sent %s for %s, assigned to %s: ignored",
                        w.id, msg.TYPE, wid, req.worker_id)  # fmt: skip
            return
        if req is None:
            if isinstance(msg, p.Error):
                log.warning("worker %s error: %s %s", w.id, msg.code, msg.message)
            return  # e.g. a late token after a cancel: nothing to relay to
        sub = req.submit
        self.liveness.on_output(w.id, now)
        if isinstance(msg, p.Done):
            w.finished(wid or "", now)  # its prompt is cached there: before _forget untracks
            self._served_done(w, wid or "", now)
        self._forget(w, req)
        self.admission.on_done(now)
        if isinstance(msg, p.Done):
            self.calibration.on_done(msg.stats, msg.finish_reason, req.budget)
            self._send_buffered(req)
            stats = req.final_stats(msg.stats, now, req.policy)
            self.out.to_client(req.client, p.Done(sub.request_id, msg.finish_reason, stats))
            self.settling.append((self.metrics.on_done, (req.policy, msg.finish_reason, stats)))
        else:
            self.out.to_client(req.client, p.Error(msg.code, msg.message, sub.request_id))
            self.metrics.on_outcome(req.policy, msg.code)

    def _busy_since(self, w: WorkerState, now: float) -> float:
        """When ``w``, idle at its last event, took the requests it holds."""
        held = (self.requests.get(wid) for wid in w.inflight)
        return min((r.t_assigned for r in held if r is not None), default=now)

    def _served_done(self, w: WorkerState, wid: str, now: float) -> None:
        """A Done closes its request's work: a request that gave no token (its prompt
        only cached) delivered its prompt's (broker/observed.py)."""
        routed = w.inflight.get(wid)
        prompt_n = 0
        if routed is not None and not routed.tokens_seen:
            prompt_n = max(1, routed.prompt_tokens - routed.cached_estimate)
        since = self._busy_since(w, now) if w.served.idle else None
        w.served_work(now, since, (0, prompt_n, 0), self.cfg.calibrate)

    # ------------------------------------------------------------ giving workers up
    def tick(self, now: float) -> None:
        """Give up workers silent or stuck past their windows (a walk of every worker:
        done at most every EXPIRE_EVERY_S, however often it is called)."""
        if now < self._expiry_at:
            return
        self._expiry_at = now + EXPIRE_EVERY_S
        self.starting.expire(now)
        for w in list(self.workers.values()):
            window_s = w.liveness_s(self.cfg.liveness_s)
            why = self.liveness.why_expired(w.id, w.last_seen, window_s, bool(w.inflight), now)
            if why:
                self._drop_worker(w, why, now)

    def disconnected(self, now: float) -> None:
        """Some worker's connection closed (the event does not say whose): every worker
        is probed now and shortly after (broker/liveness.py)."""
        self.liveness.on_disconnect(now)

    def probe(self, now: float) -> None:
        """When probes are due, a Welcome to every worker: one that cannot be sent it
        has left, and is dropped when the driver reports it (``assigns_lost``)."""
        if self.liveness.probe_due(now):
            welcome = self._welcome()
            for w in self.workers.values():
                self.out.to_worker(w.identity, welcome)

    def assigns_lost(self, identity: bytes, lost: list[p.Message], now: float) -> None:
        """Messages that could not be sent to ``identity``: the worker is gone; the
        requests assigned in them wait for another, first in the queue, as if never
        assigned (no reroute counted)."""
        w, again = self._worker_by_identity(identity), []
        for msg in lost:
            if not isinstance(msg, p.Assign):
                continue
            req = self.requests.get(msg.request_id)
            if req is not None and w is not None and req.worker_id == w.id:
                self.accepts.pop(msg.request_id, None)  # it was never accepted there
                self._forget(w, req)
                req.wid = req.worker_id = None
                again.append(req)
        if w is not None:
            self._drop_worker(w, "unreachable", now)
        self.pending.extendleft(reversed(again))

    def _drop_worker(self, w: WorkerState, why: str, now: float) -> None:
        log.warning("worker %s removed: %s", w.id, why)
        self.workers.pop(w.id, None)
        self._hb_frames.pop(w.identity, None)
        if self._by_identity.get(w.identity) == w.id:
            del self._by_identity[w.identity]
        self.metrics.on_worker_removed(w.id)
        self.liveness.forget(w.id)
        again = []
        for wid in list(w.inflight):
            req = self.requests.get(wid)
            if req is None:
                continue
            self._forget(w, req)
            self.out.to_worker(w.identity, p.Cancel(wid))  # if it lives, stop it there
            if req.can_reroute():  # continues elsewhere after the output already relayed
                req.reroute(w.id, now, self.cfg.no_worker_wait_s)
                again.append(req)
            else:
                self._fail(req, p.WORKER_LOST, f"worker {w.id} was lost ({why})")
        self.pending.extendleft(reversed(again))  # ahead of newer requests, in their order
