"""Admission control: how much the router takes in, holds, and does per loop turn.

Every queue the router owns is bounded, so no flood can grow its memory without
limit (docs/ROUTING.md, "Admission and backpressure"):

- requests waiting for a worker: at most ``max_pending`` of them holding at most
  ``max_pending_units`` prompt units (token ids, or 4 characters of text); past
  that a Submit is answered ``overloaded`` with a ``retry_after_s`` hint;
- requests assigned to one worker: at most ``inflight_cap(max_active)`` (its
  batch plus a queue budget per slot); a request that fits no worker with room
  waits in the pending queue instead of deepening one worker's FIFO;
- prompts: at most ``max_prompt_chars`` characters / ``max_prompt_tokens`` ids
  (a 4 MiB prompt took seconds to tokenize on the loop), and every frame at most
  ``max_frame_bytes`` (ZMQ_MAXMSGSIZE: a larger frame closes the connection);
- work per loop turn: ``client_frames_per_turn`` client frames and
  ``routes_per_turn`` routing decisions, so worker frames (heartbeats, tokens)
  are read between any two slices of client work.
"""

from __future__ import annotations

from dataclasses import dataclass

from tandem.common import protocol as p
from tandem.common.transport import CLIENT_FRAME_BYTES

WORKER_FRAME_BYTES = 64 << 20  # a Ready carries the whole tokenizer (a few MB)


@dataclass(frozen=True)
class AdmissionConfig:
    max_pending: int = 1024
    max_pending_units: int = 1 << 22  # prompt ids (or 4 chars) held by the pending queue
    queue_per_slot: int = 16  # queued requests a worker may hold per batch slot
    max_prompt_chars: int = 1 << 20
    max_prompt_tokens: int = 1 << 17
    client_frames_per_turn: int = 64
    routes_per_turn: int = 64
    max_frame_bytes: int = CLIENT_FRAME_BYTES

    def __post_init__(self) -> None:
        if self.max_pending < 1 or self.max_pending_units < 1 or self.queue_per_slot < 0:
            raise ValueError("max_pending, max_pending_units must be >= 1, queue_per_slot >= 0")
        if self.max_prompt_chars < 1 or self.max_prompt_tokens < 1:
            raise ValueError("max_prompt_chars and max_prompt_tokens must be >= 1")
        if self.client_frames_per_turn < 1 or self.routes_per_turn < 1:
            raise ValueError("client_frames_per_turn and routes_per_turn must be >= 1")
        if self.max_frame_bytes < 1024:
            raise ValueError("max_frame_bytes must be >= 1024")

    def inflight_cap(self, max_active: int) -> int:
        """Requests one worker may hold: its batch plus ``queue_per_slot`` per slot."""
        return max_active * (1 + self.queue_per_slot)


class Admission:
    """The router's gate: prompt limits and the pending bound with its retry hint."""

    RATE_HALF_LIFE = 20  # completions: how fast the retry hint follows the throughput

    def __init__(self, cfg: AdmissionConfig) -> None:
        self.cfg = cfg
        self._gap_s = 0.0  # smoothed seconds between completions (0: none seen yet)
        self._last_done = 0.0
        self.refused = 0  # Submits answered overloaded, for status and tests

    def prompt_problem(self, sub: p.Submit) -> p.Problem | None:
        """A prompt over the size limits, or None (checked before any tokenizing)."""
        cfg = self.cfg
        if sub.tokens is not None and len(sub.tokens) > cfg.max_prompt_tokens:
            return _too_long(f"{len(sub.tokens)} token ids; at most {cfg.max_prompt_tokens}")
        chars = prompt_chars(sub)
        if chars > cfg.max_prompt_chars:
            return _too_long(f"{chars} characters; at most {cfg.max_prompt_chars}")
        return None

    def full_problem(self, n_pending: int, units: int) -> p.Problem | None:
        """``overloaded`` when the pending queue (``n_pending`` requests holding
        ``units`` with the new one) is past its bounds, or None."""
        if n_pending < self.cfg.max_pending and units <= self.cfg.max_pending_units:
            return None
        self.refused += 1
        return p.Problem(
            p.OVERLOADED,
            f"the router holds {n_pending} waiting requests (its limit); retry in "
            f"{self.retry_after_s(n_pending):.1f}s",
        )

    def error(self, problem: p.Problem, sub: p.Submit, n_pending: int) -> p.Error:
        """The reply refusing ``sub``; ``overloaded`` carries the retry hint."""
        retry = None
        if problem.code == p.OVERLOADED:
            retry = round(self.retry_after_s(n_pending), 3)
        return p.Error(problem.code, problem.message, sub.request_id, retry)

    def retry_after_s(self, n_pending: int) -> float:
        """When the queue should have room: its length over the recent completion rate."""
        if self._gap_s <= 0:
            return 1.0
        return min(60.0, max(0.1, n_pending * self._gap_s))

    def on_done(self, now: float) -> None:
        """One request finished: update the completion rate behind the retry hint."""
        if self._last_done:
            gap_s = now - self._last_done
            alpha = 1.0 / self.RATE_HALF_LIFE
            self._gap_s = gap_s if not self._gap_s else self._gap_s + alpha * (gap_s - self._gap_s)
        self._last_done = now


def prompt_units(sub: p.Submit) -> int:
    """What a waiting request's prompt weighs: its ids, or a quarter of its characters."""
    return len(sub.tokens) if sub.tokens is not None else prompt_chars(sub) // 4 + 1


def prompt_texts(sub: p.Submit) -> list[str]:
    """The text ``sub`` gives to tokenize: its prompt and its chat messages' contents
    (a Submit sets one of them, or token ids and neither)."""
    head = [sub.prompt] if sub.prompt is not None else []
    return head + [str(m.get("content", "")) for m in sub.messages or ()]


def prompt_chars(sub: p.Submit) -> int:
    """How much text ``sub`` gives to tokenize."""
    return sum(map(len, prompt_texts(sub)))


def _too_long(what: str) -> p.Problem:
    return p.Problem(p.PROMPT_TOO_LONG, f"the prompt is too large for this router: {what}")
