"""The router core's routing: waiting requests placed on workers, in order.

``dispatch`` takes requests from the head of the pending queue: each is
tokenized (or handed to the tokenizing pool, broker/tokenize.py), offered to the
workers it fits that have room (broker/ledger.py), decided by the policy, and
assigned: its Assign is owed to the worker, its Accepted held for a moment to
leave with its first output (``accept_hold_ms``).
"""

from __future__ import annotations

import json
import math

from tandem.broker.admission import prompt_chars, prompt_texts
from tandem.broker.capabilities import capable_ids, excluded, unservable
from tandem.broker.decisions import decision_record
from tandem.broker.ledger import PromptBlocks
from tandem.broker.policies import Decision, Forced, NoCandidate, RouteRequest, parse_policy
from tandem.broker.registry import Routed, WorkerState
from tandem.broker.requests import ClientRequest, prompt_tokens

# Relative: mypy checks broker/ as files, and sees the core's base classes (so the
# attributes they declare) only through an import it can follow.
from tandem.broker.state import CoreState, log
from tandem.common import protocol as p
from tandem.common.schema_keywords import unenforced


class Routing(CoreState):
    def dispatch(self, now: float, limit: int | None = None) -> bool:
        """Route waiting requests in order; True when ``limit`` routes left some behind."""
        routed = 0
        while self.pending:
            req = self.pending[0]
            if not self.workers:
                if now < req.deadline:
                    return False
                self.pending.popleft()
                self._fail(req, p.NO_WORKERS, "no worker is connected to the router")
                continue
            if limit is not None and routed >= limit:
                return True
            self.pending.popleft()
            routed += 1
            if self._unservable(req):
                continue
            if self.tokenizer is not None and self.tokenizing.wants(req):
                if not self._beyond_every_context(req):
                    self.tokenizing.start(req, self.tokenizer)  # back when tokenized
                continue
            try:
                placed = self.route(req, now)
            except Exception as exc:  # a bug must cost one request an error, not a hang
                log.exception("routing %s failed", req.submit.request_id)
                self._fail(req, p.INTERNAL, f"router error: {exc}")
                continue
            if not placed:  # every worker it fits is at its in-flight cap: wait, in order
                self.pending.appendleft(req)
                return False
        return False

    def _unservable(self, req: ClientRequest) -> bool:
        """Fail ``req`` now when no registered worker has the capabilities it needs
        (broker/capabilities.py says why at once rather than after a wait)."""
        needs = req.needs
        if not needs or capable_ids(self.workers.values(), needs):
            return False
        why = unservable(self.workers.values(), needs)
        if p.Capability.JSON_SCHEMA_FULL in needs and req.submit.sampling.json_schema:
            keyword = unenforced(json.loads(req.submit.sampling.json_schema))
            why += f"; json_schema_full because the schema uses {keyword}"
        self._fail(req, p.BAD_REQUEST, why)
        return True

    def _beyond_every_context(self, req: ClientRequest) -> bool:
        """Fail ``req`` now when its text alone is more tokens than any worker's context
        holds. The tokenizer bounds a text's token count from below without tokenizing
        it (each token stands for at most its vocabulary entry's length in characters,
        common/tokenizer.py ``fewest_tokens``), so a 1 Mi-character prompt against 8
        Ki-token contexts is refused without the ~0.9 s of tokenizing it nor the ~10 ms
        its 270k ids take to become a list under the GIL (the longest the loop stood
        still in docs/results/reliability.md's flood)."""
        if self.tokenizer is None:
            return False
        sub = req.submit
        least = sum(map(self.tokenizer.fewest_tokens, prompt_texts(sub)))
        if not least or any(w.fits(least, req.budget_left) for w in self.workers.values()):
            return False
        limit = max(w.info.n_ctx for w in self.workers.values())
        self._fail(
            req,
            p.PROMPT_TOO_LONG,
            f"the prompt ({prompt_chars(sub)} characters, so at least {least} tokens) "
            f"+ max_tokens ({req.budget_left}) exceeds every worker's context "
            f"(largest {limit}) or max_tokens limit",
        )
        return True

    def tokenized(self) -> None:
        """Requests whose prompts were tokenized beside the loop go back to the head of
        the queue (they came before the ones there), or fail as they would have."""
        back = []
        for req, tokens in self.tokenizing.finished():
            if isinstance(tokens, ValueError):
                self._fail(req, p.BAD_REQUEST, str(tokens))
            elif isinstance(tokens, BaseException):
                log.error("tokenizing %s failed: %r", req.submit.request_id, tokens)
                self._fail(req, p.INTERNAL, f"router error: {tokens}")
            else:
                req.tokens = tokens
                back.append(req)
        self.pending.extendleft(reversed(back))

    def route(self, req: ClientRequest, now: float) -> bool:
        """Assign ``req`` (or fail it); False when it must wait for room on a worker."""
        sub = req.submit
        t0 = self.cost_clock()
        if req.tokens is None:
            try:
                req.tokens = prompt_tokens(sub, self.tokenizer)
            except ValueError as exc:
                self._fail(req, p.BAD_REQUEST, str(exc))
                return True
        if req.output_ids and req.budget_left <= 0:  # migrated after its last token
            self._finish_migrated(req, now)
            return True
        tokens = req.tokens + req.output_ids  # a migrated stream continues after its output
        n, budget = len(tokens), req.budget_left  # once, not once per worker
        blocks = PromptBlocks(tokens)  # hashed once per block size, not once per worker
        policy = parse_policy(f"forced:{sub.worker}") if sub.worker else self.policy
        # Routing's hard constraint: only the workers with the capabilities it needs.
        needs = req.needs
        capable = capable_ids(self.workers.values(), needs) if needs else None
        # Nothing to choose (one worker has room and it fits): nothing to score, and
        # no view of it to build (unless decisions are logged: a record shows views).
        self.views.refresh(self.workers.values())
        lone = self.views.sole(n, budget) if policy.takes_any and not self.log_decisions else None
        if lone is not None and capable is not None and lone.id not in capable:
            lone = None
        if lone is not None:
            rr, elapsed_s = self.calibration.route_request(n, budget), self.cost_clock() - t0
            self._place(req, tokens, lone, blocks, policy.name, rr, Decision(lone.id, {}), 1,
                        elapsed_s, now)  # fmt: skip
            return True
        # One pass: views of the workers it fits that have room (batch + queue share).
        views = self.views.offered(blocks, n, budget)
        if capable is not None:
            views = [v for v in views if v.id in capable]
        if not views:
            return self._no_room(req, n, budget, capable)
        # A migrated request is not an arrival: nothing to expect from it.
        arrivals = () if req.lost_on else req.arrivals_before
        rr = self.calibration.route_request(n, budget, arrivals)
        try:
            if len(views) == 1 and policy.takes_any:  # nothing to choose: nothing to score
                decision = Decision(views[0].id, {})
            else:
                decision = policy.choose(rr, views)
        except NoCandidate as exc:
            return self._no_candidate(req, policy, exc, n, budget, capable)
        elapsed_s = self.cost_clock() - t0  # the decision, not the writing of its record
        if self.log_decisions:
            extra = self.calibration.log_fields()
            if needs:  # the workers passed over for what they lack, and why
                extra |= {
                    "needs": sorted(needs),
                    "excluded": excluded(self.workers.values(), needs),
                }
            record = decision_record(sub.request_id, policy.name, rr, views, decision, extra)
            self.out.decisions.append((now, record))
        w = self.workers[decision.worker_id]
        self._place(req, tokens, w, blocks, policy.name, rr, decision, len(views), elapsed_s,
                    now)  # fmt: skip
        return True

    def _no_room(
        self, req: ClientRequest, n: int, budget: int, capable: set[str] | None = None
    ) -> bool:
        """No worker with room (and the capabilities it needs: ``capable``, None for
        any) fits ``req``: it waits if one would fit it, else fails."""
        ws = [w for w in self.workers.values() if capable is None or w.id in capable]
        if any(w.fits(n, budget) for w in ws):
            return False  # it fits somewhere: wait for room
        limit = max((w.info.n_ctx for w in ws), default=0)
        self._fail(
            req,
            p.PROMPT_TOO_LONG,
            f"prompt ({n} tokens) + max_tokens ({budget}) exceeds every "
            f"worker's context (largest {limit}) or max_tokens limit",
        )
        return True

    def _no_candidate(
        self, req: ClientRequest, policy: object, exc: NoCandidate, n: int, budget: int,
        capable: set[str] | None = None,
    ) -> bool:  # fmt: skip
        """Pinned by the request (its policy is then forced:<worker>), or by a forced
        router policy (`--policy forced:gpu`), to no worker offered (among the ones
        with the capabilities it needs: ``capable``, None for any): wait or fail."""
        pinned = policy.selector if isinstance(policy, Forced) else None
        if capable is not None and self._pinned_incapable(req, pinned, capable):
            return True
        fitting = [
            w
            for w in self.workers.values()
            if w.fits(n, budget) and (capable is None or w.id in capable)
        ]
        if any(pinned in (w.id, w.info.device) for w in fitting):
            return False  # the pinned worker is full: wait for it
        too_long = any(pinned in (w.id, w.info.device) for w in self.workers.values())
        if req.lost_on and not too_long:  # pinned to the worker it lost: no migration
            lost = f"worker {req.lost_on[-1]} was lost; the request is pinned to {pinned!r}"
            self._fail(req, p.WORKER_LOST, lost)
            return True
        code = p.PROMPT_TOO_LONG if too_long else p.NO_WORKERS
        self._fail(req, code, f"{exc} that fits this request" if too_long else str(exc))
        return True

    def _pinned_incapable(self, req: ClientRequest, pinned: str | None, capable: set[str]) -> bool:
        """Fail ``req`` when the workers it is pinned to all lack a capability it needs."""
        chosen = [w for w in self.workers.values() if pinned in (w.id, w.info.device)]
        if not chosen or any(w.id in capable for w in chosen):
            return False
        why = unservable(chosen, req.needs, whom="worker")
        self._fail(req, p.BAD_REQUEST, f"the request is pinned to {pinned!r}: {why}")
        return True

    def _place(
        self,
        req: ClientRequest,
        tokens: list[int],
        w: WorkerState,
        blocks: PromptBlocks,
        policy: str,
        rr: RouteRequest,
        decision: Decision,
        candidates: int,
        elapsed_s: float,
        now: float,
    ) -> None:
        """``req`` goes to ``w``, chosen by ``policy`` among ``candidates`` workers in a
        decision of ``elapsed_s``; its metrics are settled later."""
        req.policy = policy
        self.assign(req, tokens, w, blocks, now)
        args = (req.submit.request_id, policy, rr, decision, candidates, req.cached_estimate,
                elapsed_s)  # fmt: skip
        self.settling.append((self.metrics.on_decision, args))

    def assign(
        self, req: ClientRequest, tokens: list[int], w: WorkerState, blocks: PromptBlocks,
        now: float,
    ) -> None:  # fmt: skip
        """``req`` (whose prompt is ``tokens``) is ``w``'s: its Assign is owed to ``w``
        (an Assign that cannot leave puts its request back in the queue,
        ``assigns_lost``), the ledger and the client's Accepted follow."""
        sub = req.submit
        wid = self.ids.next()
        cached = blocks.cached_on(w)  # as its view said (the chain is hashed as far already)
        resume = len(req.output_ids)
        self.out.to_worker(w.identity, p.Assign(wid, tokens, req.continued_sampling(), resume))
        req.wid, req.worker_id, req.t_assigned = wid, w.id, now
        req.prompt_tokens, req.cached_estimate = len(req.tokens or ()), cached
        prefill_only = sub.sampling.prefill_only
        # Hashed in full only if it finishes there (WorkerState.finished notes them).
        chain = blocks.chain(w.info.block_size)
        w.track(Routed(wid, w.id, len(tokens), req.budget_left, cached, prefill_only, 0, chain))
        w.routed_total += 1
        self.requests[wid] = req
        self._by_client[(req.client, sub.request_id)] = wid
        if not resume:  # a migrated stream goes on as one stream: no second Accepted
            accepted = p.Accepted(sub.request_id, w.id, len(tokens), cached)
            self.accepts[wid] = (req, accepted, now + self.cfg.accept_hold_ms / 1e3)

    # ------------------------------------------------------------ held Accepteds
    def release_accepts(self, now: float) -> None:
        """Accepteds whose hold is over go out alone (they are held oldest first)."""
        if not self.accepts:
            return
        due = []
        for wid, (_, _, at) in self.accepts.items():
            if at > now:
                break
            due.append(wid)
        for wid in due:
            self._release_accept(wid)

    def wait_ms(self, now: float) -> int:
        """How long the driver may wait for input: until the first held Accepted is due
        (at most 100 ms)."""
        if not self.accepts:
            return 100
        first = next(iter(self.accepts.values()))[2]
        return max(0, min(100, math.ceil((first - now) * 1e3)))
