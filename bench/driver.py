"""Drive one workload against a running cluster and time every request client-side.

One ``AsyncClient`` connection carries all requests. Arrivals are scheduled on
the event loop at absolute times (t0 + offset), so a slow submit never pushes
later arrivals back (no drift). Per request we keep: submit, first-token and
done times, every token's arrival (for inter-token latency), the worker, and the
stats of ``Done``. Times are seconds of ``time.monotonic()`` (the event loop's
clock, the same CLOCK_MONOTONIC the router and workers use).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from tandem.bench.workload import Arrival, PromptBook
from tandem.client.aio import AsyncClient
from tandem.client.errors import TandemError
from tandem.client.session import Assembly

LEAD_S = 0.2  # first arrival this long after scheduling, so every task is waiting by then


@dataclass
class RequestRecord:
    """What the client saw of one request (times are absolute monotonic seconds)."""

    index: int
    request_id: str
    hit: bool
    scheduled_s: float
    submit_s: float = 0.0
    token_s: list[float] = field(default_factory=list)  # arrival of each token
    done_s: float | None = None
    worker: str | None = None
    finish_reason: str | None = None
    output_tokens: int = 0
    stats: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


class TimedClient(AsyncClient):
    """AsyncClient that notes when each token arrives.

    ``stream`` hides the final stats and ``generate`` the token times; this needs
    both, so it drives the shared ``_run`` generator that both are built on.
    """

    async def timed(self, rec: RequestRecord, tokens: list[int], **kwargs: Any) -> None:
        loop = asyncio.get_running_loop()
        out: dict[str, Assembly] = {}
        rec.submit_s = loop.time()
        try:
            async for delta in self._run(None, {"tokens": tokens, **kwargs}, out):
                if delta.token_ids:  # the last flush of held-back text carries no token
                    rec.token_s.extend([loop.time()] * len(delta.token_ids))
        except TandemError as exc:
            rec.error = f"{exc.code}: {exc.message}"
        rec.done_s = loop.time()
        result = out["asm"].result if "asm" in out else None
        if result is not None:
            rec.worker = result.worker
            rec.finish_reason = result.finish_reason
            rec.output_tokens = len(result.token_ids)
            rec.stats = dict(result.stats)


async def seed_workers(
    address: str, worker_ids: list[str], prefix: list[int], timeout_s: float
) -> dict[str, dict[str, Any]]:
    """Prefill ``prefix`` into every worker's cache (pinned, prefill_only); wait for all."""
    ac = TimedClient(address, timeout_s=timeout_s)
    try:
        results = await asyncio.gather(
            *[ac.generate(tokens=prefix, prefill_only=True, worker=w) for w in worker_ids]
        )
    finally:
        await ac.close()
    return {w: dict(r.stats) for w, r in zip(worker_ids, results, strict=True)}


async def pinned_batch(
    address: str, worker_id: str, prompt: list[int], n: int, max_tokens: int, timeout_s: float
) -> list[RequestRecord]:
    """``n`` identical requests sent together to one worker (for rate calibration)."""
    recs = [RequestRecord(i, "", True, 0.0) for i in range(n)]
    ac = TimedClient(address, timeout_s=timeout_s)
    try:
        await asyncio.gather(
            *[
                ac.timed(r, prompt, max_tokens=max_tokens, ignore_eos=True, worker=worker_id)
                for r in recs
            ]
        )
    finally:
        await ac.close()
    return recs


async def run_arrivals(
    address: str,
    arrivals: list[Arrival],
    book: PromptBook,
    max_tokens: int,
    timeout_s: float,
    on_done: Any = None,
) -> list[RequestRecord]:
    """Submit every arrival at its scheduled time; return when all have ended."""
    loop = asyncio.get_running_loop()
    prompts = [book.prompt(a) for a in arrivals]  # tokenize before the clock starts
    t0 = loop.time() + LEAD_S
    recs = [RequestRecord(a.index, f"bench-{a.index}", a.hit, t0 + a.offset_s) for a in arrivals]

    async def one(ac: TimedClient, rec: RequestRecord, prompt: list[int], n_out: int) -> None:
        await asyncio.sleep(max(0.0, rec.scheduled_s - loop.time()))
        await ac.timed(rec, prompt, max_tokens=n_out, ignore_eos=True, request_id=rec.request_id)
        if on_done is not None:
            on_done(rec)

    ac = TimedClient(address, timeout_s=timeout_s)
    try:
        await asyncio.gather(
            *[
                one(ac, r, p, a.output_tokens or max_tokens)
                for r, p, a in zip(recs, prompts, arrivals, strict=True)
            ]
        )
    finally:
        await ac.close()
    return recs
