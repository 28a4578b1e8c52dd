"""A client's request as the router tracks it, and the checks a Submit must pass."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tandem.common import protocol as p
from tandem.common.tokenizer import TextTokenizer

MAX_REROUTES = 2  # a request that killed two workers is not sent to a third


def validate_submit(msg: p.Submit) -> p.Problem | None:
    """What keeps ``msg`` from being routed, or None."""
    given = [x is not None for x in (msg.prompt, msg.tokens, msg.messages)]
    if sum(given) != 1:
        return p.Problem.bad_request("give exactly one of prompt, tokens or messages")
    if not msg.request_id:
        return p.Problem.bad_request("request_id must be a non-empty string")
    if msg.prompt is not None and not msg.prompt:
        return p.Problem.bad_request("the prompt is empty")
    if msg.tokens is not None and not msg.tokens:
        return p.Problem.bad_request("tokens is empty")
    if msg.messages is not None and not msg.messages:
        return p.Problem.bad_request("messages is empty")
    return msg.sampling.problem()


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
    buffer_ids: list[int] = field(default_factory=list)  # stream=False: held until done
    buffer_text: list[str] = field(default_factory=list)
    lost_on: list[str] = field(default_factory=list)  # workers that died holding it

    def can_reroute(self) -> bool:
        """True while the client has seen none of its output (a streamed token, once
        sent, cannot be taken back) and it has not already outlived MAX_REROUTES workers."""
        unseen = not self.submit.stream or not self.t_first
        return unseen and len(self.lost_on) < MAX_REROUTES

    def reroute(self, lost_worker: str, now: float, wait_s: float) -> None:
        """Back to unassigned, its partial output dropped; it may wait ``wait_s`` for a worker."""
        self.lost_on.append(lost_worker)
        self.wid = self.worker_id = None
        self.t_first = 0.0
        self.buffer_ids.clear()
        self.buffer_text.clear()
        self.deadline = now + wait_s

    @property
    def budget(self) -> int:
        return self.submit.sampling.budget

    def on_tokens(self, msg: p.TokenDelta, now: float) -> None:
        if not self.t_first and msg.token_ids:
            self.t_first = now
        if not self.submit.stream:
            self.buffer_ids.extend(msg.token_ids)
            self.buffer_text.append(msg.text)

    def final_stats(self, worker_stats: dict[str, Any], now: float, policy: str) -> dict[str, Any]:
        """Worker stats plus what only the router can measure (its clock, end to end)."""
        out = dict(worker_stats)
        routing_s = max(0.0, self.t_assigned - self.received)
        out["queue_s"] = routing_s + float(worker_stats.get("worker_queue_s", 0.0))
        out["ttft_s"] = (self.t_first - self.received) if self.t_first else None
        out["e2e_s"] = now - self.received
        out["worker"] = self.worker_id
        out["policy"] = policy
        out["router_cached_estimate"] = self.cached_estimate
        if self.lost_on:
            out["rerouted_from"] = list(self.lost_on)
        return out


def prompt_tokens(sub: p.Submit, tokenizer: TextTokenizer | None) -> list[int]:
    """The token ids ``sub`` asks for (given, or its prompt / chat messages encoded);
    ValueError when they cannot be had."""
    if tokenizer is None:
        raise ValueError("the router has no tokenizer yet")
    if sub.tokens is not None:
        n_vocab = tokenizer.vocab_size
        if sub.tokens and (min(sub.tokens) < 0 or max(sub.tokens) >= n_vocab):  # C loops
            bad = [t for t in sub.tokens if not 0 <= t < n_vocab]
            raise ValueError(f"token ids outside the vocabulary: {bad[:5]}")
        return list(sub.tokens)
    text = sub.prompt if sub.messages is None else tokenizer.apply_chat_template(sub.messages)
    tokens = tokenizer.encode(text or "")
    if not tokens:
        raise ValueError("the prompt is empty")
    return tokens
