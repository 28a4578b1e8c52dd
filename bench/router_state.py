"""A Router in process with many registered workers, for timing one decision.

Sends (and the queues sends go through) are replaced by stubs that accept
everything: the router is never served, only its ``route`` is called, so what is
timed is the decision (tokens, views, policy, Assign built) and nothing of the
sockets; the work it leaves for after its frames leave (metrics) runs untimed.
"""

from __future__ import annotations

import gc
import logging
import random
import time
import uuid

from tandem.bench.null_peers import tiny_spec
from tandem.broker.ledger import PromptBlocks
from tandem.broker.requests import ClientRequest
from tandem.broker.router import Router, RouterConfig
from tandem.common import protocol as p
from tandem.common.blocks import block_hashes
from tandem.common.settings import Addresses

PROMPT_TOKENS = 512
BLOCK = 16
PREFIXES = [[(97 * i + 31 * k) % 997 + 1 for k in range(PROMPT_TOKENS)] for i in range(8)]


def _accept_all(*_: object) -> bool:
    return True


def _nothing_lost() -> list:
    return []


def loaded_router(n_workers: int, rng: random.Random, inflight_each: int = 2) -> Router:
    """A router with ``n_workers`` workers, each with ``inflight_each`` requests that
    its last heartbeat lists and the blocks of one of PREFIXES cached."""
    logging.getLogger("tandem.broker").setLevel(logging.WARNING)  # not a line per worker
    tag = uuid.uuid4().hex
    router = Router(RouterConfig(addresses=Addresses(f"inproc://c{tag}", f"inproc://w{tag}")))
    for sock in (router.client_sock, router.worker_sock):
        sock.send = _accept_all  # type: ignore[method-assign]
        sock.queue = _accept_all  # type: ignore[method-assign]
        sock.flush = _nothing_lost  # type: ignore[method-assign]
    spec = tiny_spec()
    for i in range(n_workers):
        prefill = rng.choice([200.0, 2500.0])
        ready = p.Ready(f"w{i}", "sim", "sim", "m.gguf", 4, 8192, BLOCK, prefill,
                        [50.0, 80.0, 100.0, 110.0], 0.5, spec)  # fmt: skip
        router.register(f"w{i}".encode(), ready)
    for w in list(router.workers.values()):  # assigned directly: warming costs no decisions
        for _ in range(inflight_each):
            tokens = rng.choice(PREFIXES)[:300]
            sub = p.Submit(uuid.uuid4().hex, tokens=tokens, sampling=p.SamplingParams(64))
            req = ClientRequest(b"bench-client", sub, time.monotonic())
            router._assign(req, tokens, w, PromptBlocks(tokens))
    for i, w in enumerate(list(router.workers.values())):
        rows = [p.RequestRow(wid, 300, 0, 100, 20) for wid in w.inflight]
        hashes = block_hashes(PREFIXES[i % len(PREFIXES)][: BLOCK * 20], BLOCK)
        cache = {"full": True, "seq": 1, "blocks": hashes}
        router.on_worker(w.identity, p.Heartbeat(w.id, 1, rows, [], 0, 8192, cache))
    gc.freeze()  # as Router.serve does once workers have registered
    return router


def _route(router: Router, rid: str, tokens: list[int]) -> ClientRequest:
    sub = p.Submit(rid, tokens=tokens, sampling=p.SamplingParams(64))
    req = ClientRequest(b"bench-client", sub, time.monotonic())
    router.route(req)
    return req


def time_decision(router: Router, i: int) -> float:
    """Seconds to route one 512-token request; the assignment is undone after."""
    tokens = PREFIXES[i % len(PREFIXES)][: PROMPT_TOKENS - 8] + [i % 900 + 1] * 8
    t0 = time.perf_counter()
    req = _route(router, f"timed{i}", tokens)
    elapsed = time.perf_counter() - t0
    router._flush()  # the deferred metrics, untimed
    w = router.workers[req.worker_id]
    router._forget(w, req)
    return elapsed
