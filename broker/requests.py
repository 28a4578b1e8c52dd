"""A client's request as the router tracks it, and the checks a Submit must pass."""

from __future__ import annotations

import functools
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from tandem.broker.arrivals import ages
from tandem.common import protocol as p
from tandem.common.validation import submit_problem

MAX_REROUTES = 2  # a request that killed two workers is not sent to a third
SEED_SPACE = 2**64


class PromptTokenizer(Protocol):
    """What the router asks of its tokenizer: common/tokenizer.py's TextTokenizer, or a
    driver's stand-in that takes token ids only (twin/loop.py)."""

    vocab_size: int

    def fewest_tokens(self, text: str) -> int: ...  # a lower bound; 0: none (TextTokenizer's)

    def encode(self, text: str, *, release_gil: bool = False) -> list[int]: ...

    def apply_chat_template(self, messages: list[dict[str, Any]]) -> str: ...


def validate_submit(msg: p.Submit) -> p.Problem | None:
    """What keeps ``msg`` from being routed, or None: the rules every side runs
    (common/validation.py ``submit_problem``), again for a Submit a driver handed the
    core without decoding it (the twin, tests)."""
    return submit_problem(msg)


@dataclass
class ClientRequest:
    client: bytes  # the client's socket identity
    submit: p.Submit
    received: float  # router clock at Submit
    deadline: float = 0.0  # while waiting for a first worker
    wid: str | None = None  # worker-side id, once assigned
    worker_id: str | None = None
    t_assigned: float = 0.0
    t_first: float = 0.0
    prompt_tokens: int = 0
    cached_estimate: int = 0
    policy: str = ""  # the policy that chose the worker (forced:<sel> when pinned)
    tokens: list[int] | None = None  # the prompt's ids, once tokenized
    output_ids: list[int] = field(default_factory=list)  # relayed so far (all workers)
    buffer_text: list[str] = field(default_factory=list)  # stream=False: held until done
    buffer_logprobs: list[p.TokenLogprob] | None = None  # stream=False, when asked for
    lost_on: list[str] = field(default_factory=list)  # workers that died holding it
    migrated_tokens: int = 0  # output already produced when it last changed worker
    # ArrivalLog.record at its arrival: the clock times of the arrivals before it.
    earlier_arrivals: tuple[float, ...] = ()

    @functools.cached_property
    def needs(self) -> frozenset[str]:
        """The capabilities its sampling needs (``SamplingParams.needs``), read once: a
        json_schema's keywords come from parsing its JSON, and a request that waits for
        room is routed again on every pass."""
        return self.submit.sampling.needs()

    def can_reroute(self) -> bool:
        """True until it has outlived MAX_REROUTES workers: a stream that already sent
        tokens migrates (the next worker continues after them), it is not restarted."""
        return len(self.lost_on) < MAX_REROUTES

    def reroute(self, lost_worker: str, now: float, wait_s: float) -> None:
        """Back to unassigned, its output so far kept; it may wait ``wait_s`` for a worker."""
        self.lost_on.append(lost_worker)
        self.wid = self.worker_id = None
        self.migrated_tokens = len(self.output_ids)
        self.deadline = now + wait_s

    @property
    def arrivals_before(self) -> tuple[float, ...]:
        """How long before it each recent client request arrived (newest first)."""
        return ages(self.received, self.earlier_arrivals)

    @property
    def budget(self) -> int:
        return self.submit.sampling.budget

    @property
    def budget_left(self) -> int:
        """Output tokens still to produce (the whole budget unless it migrated)."""
        return self.budget - len(self.output_ids)

    def continued_sampling(self) -> p.SamplingParams:
        """The parameters for the worker that runs it next: the remaining budget and,
        after a migration, a seed moved on by the tokens already drawn (so the
        continuation does not replay the random draws that started the stream)."""
        done = len(self.output_ids)
        if not done:
            return self.submit.sampling
        s = self.submit.sampling
        seed = None if s.seed is None else (s.seed + done) % SEED_SPACE
        return p.replace(s, max_tokens=s.max_tokens - done, seed=seed)

    def on_tokens(
        self,
        token_ids: list[int],
        text: str,
        now: float,
        logprobs: list[p.TokenLogprob] | None = None,
    ) -> None:
        """A delta relayed from its worker (``token_ids`` may be empty: held text)."""
        if not self.t_first and token_ids:
            self.t_first = now
        self.output_ids.extend(token_ids)
        if not self.submit.stream:
            self.buffer_text.append(text)
            if logprobs is not None:  # extended in place: a long answer is not copied per delta
                if self.buffer_logprobs is None:
                    self.buffer_logprobs = []
                self.buffer_logprobs.extend(logprobs)

    def final_stats(self, worker_stats: p.DoneStats, now: float, policy: str) -> p.DoneStats:
        """Worker stats plus what only the router can measure (its clock, end to end)."""
        routing_s = max(0.0, self.t_assigned - self.received)
        migrated = self.migrated_tokens or None  # the last worker counted only its own part
        return p.replace(
            worker_stats,
            queue_s=routing_s + (worker_stats.worker_queue_s or 0.0),
            ttft_s=(self.t_first - self.received) if self.t_first else None,
            e2e_s=now - self.received,
            worker=self.worker_id,
            policy=policy,
            router_cached_estimate=self.cached_estimate,
            rerouted_from=list(self.lost_on),
            migrated_tokens=migrated,
            output_tokens=len(self.output_ids) if migrated else worker_stats.output_tokens,
        )


def prompt_tokens(
    sub: p.Submit, tokenizer: PromptTokenizer | None, release_gil: bool = False
) -> list[int]:
    """The token ids ``sub`` asks for (given, or its prompt / chat messages encoded);
    ValueError when they cannot be had. ``release_gil``: off the loop, on a thread
    (broker/tokenize.py)."""
    if tokenizer is None:
        raise ValueError("the router has no tokenizer yet")
    if sub.tokens is not None:
        n_vocab = tokenizer.vocab_size
        if sub.tokens and (min(sub.tokens) < 0 or max(sub.tokens) >= n_vocab):  # C loops
            bad = [t for t in sub.tokens if not 0 <= t < n_vocab]
            raise ValueError(f"token ids outside the vocabulary: {bad[:5]}")
        return list(sub.tokens)
    text = sub.prompt if sub.messages is None else tokenizer.apply_chat_template(sub.messages)
    tokens = tokenizer.encode(text or "", release_gil=release_gil)
    if not tokens:
        raise ValueError("the prompt is empty")
    return tokens


class PendingQueue(deque):
    """The router's queue of requests waiting for a worker, with what admission asks
    of it on every submit kept as it changes: which (client, request id) keys wait
    there and the prompt units they hold (broker/admission.prompt_units). Without
    them each submit walked the queue twice."""

    def __init__(self, units: Callable[[p.Submit], int]) -> None:
        super().__init__()
        self._units_of = units
        self.keys: Counter[tuple[bytes, str]] = Counter()
        self.units = 0

    def _add(self, req: ClientRequest) -> None:
        self.keys[(req.client, req.submit.request_id)] += 1
        self.units += self._units_of(req.submit)

    def _drop(self, req: ClientRequest) -> None:
        key = (req.client, req.submit.request_id)
        self.keys[key] -= 1
        if self.keys[key] <= 0:
            del self.keys[key]
        self.units -= self._units_of(req.submit)

    def append(self, req: ClientRequest) -> None:
        super().append(req)
        self._add(req)

    def appendleft(self, req: ClientRequest) -> None:
        super().appendleft(req)
        self._add(req)

    def extendleft(self, reqs: Iterable[ClientRequest]) -> None:
        for req in reqs:
            self.appendleft(req)

    def popleft(self) -> ClientRequest:
        req = super().popleft()
        self._drop(req)
        return req

    def remove(self, req: ClientRequest) -> None:
        super().remove(req)
        self._drop(req)

    def __contains__(self, key: object) -> bool:  # a (client, request id) key
        return key in self.keys
