"""A router core in process with many registered workers, for timing one decision.

The core (broker/core.py) has no sockets: workers register and heartbeat as
events, requests are assigned to them directly, and what is timed is one call of
``route`` (tokens, views, policy, the Assign built and owed). What it owes its
peers then leaves through the core's one flush (``RouterCore.flush``), untimed,
to peers that drop it; its metrics hooks run there, as in the live loop.
"""

from __future__ import annotations

import gc
import logging
import random
import time
import uuid

from studies.null_peers import tiny_spec
from tandem.broker.config import RouterConfig
from tandem.broker.core import RouterCore
from tandem.broker.ledger import PromptBlocks
from tandem.broker.outgoing import Kept
from tandem.broker.requests import ClientRequest
from tandem.common import protocol as p
from tandem.common.blocks import block_hashes

PROMPT_TOKENS = 512
BLOCK = 16
PREFIXES = [[(97 * i + 31 * k) % 997 + 1 for k in range(PROMPT_TOKENS)] for i in range(8)]


def loaded_router(n_workers: int, rng: random.Random, inflight_each: int = 2) -> RouterCore:
    """A core with ``n_workers`` workers, each with ``inflight_each`` requests that its
    last heartbeat lists and the blocks of one of PREFIXES cached."""
    logging.getLogger("tandem.broker").setLevel(logging.WARNING)  # not a line per worker
    core = RouterCore(RouterConfig())
    spec, now = tiny_spec(), time.monotonic()
    for i in range(n_workers):
        prefill = rng.choice([200.0, 2500.0])
        ready = p.Ready(f"w{i}", "sim", "sim", "m.gguf", 4, 8192, BLOCK, prefill,
                        [50.0, 80.0, 100.0, 110.0], 0.5, spec)  # fmt: skip
        core.worker(f"w{i}".encode(), ready, now)
    for w in list(core.workers.values()):  # assigned directly: warming costs no decisions
        for _ in range(inflight_each):
            tokens = rng.choice(PREFIXES)[:300]
            sub = p.Submit(uuid.uuid4().hex, tokens=tokens, sampling=p.SamplingParams(64))
            req = ClientRequest(b"bench-client", sub, now)
            core.assign(req, tokens, w, PromptBlocks(tokens), now)
    for i, w in enumerate(list(core.workers.values())):
        rows = [p.RequestRow(wid, 300, 0, 100, 20) for wid in w.inflight]
        hashes = block_hashes(PREFIXES[i % len(PREFIXES)][: BLOCK * 20], BLOCK)
        cache = p.CacheReport(full=True, seq=1, blocks=hashes)
        core.worker(w.identity, p.Heartbeat(w.id, 1, rows, [], 0, 8192, cache), now)
    _discard(core)
    gc.freeze()  # as the live loop does once workers have registered
    return core


def _discard(core: RouterCore) -> None:
    """Drop what the core owes its (absent) peers; run its metrics hooks."""
    core.flush(Kept(), float("inf"))


def _route(core: RouterCore, rid: str, tokens: list[int]) -> ClientRequest:
    sub = p.Submit(rid, tokens=tokens, sampling=p.SamplingParams(64))
    now = time.monotonic()
    req = ClientRequest(b"bench-client", sub, now)
    core.route(req, now)
    return req


def time_decision(core: RouterCore, i: int) -> float:
    """Seconds to route one 512-token request; the assignment is undone after."""
    tokens = PREFIXES[i % len(PREFIXES)][: PROMPT_TOKENS - 8] + [i % 900 + 1] * 8
    t0 = time.perf_counter()
    req = _route(core, f"timed{i}", tokens)
    elapsed = time.perf_counter() - t0
    w = core.workers[req.worker_id or ""]
    core._forget(w, req)  # as if it had never come: the next decision sees the same fleet
    _discard(core)
    return elapsed
