"""End to end: real router and llama.cpp worker processes, real sockets, the real model."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from tandem.client import AsyncClient, Client
from tandem.common.model_files import default_model_path
from tests.helpers import LLAMA_ARGS, needs_llama

pytestmark = [needs_llama, pytest.mark.model]

PROMPT = "The three primary colors are"


def test_greedy_generation_matches_a_direct_llama_cpp_loop(cluster):
    from tests.helpers import greedy_reference

    with cluster.client() as c:
        tokens = c.generate(PROMPT, max_tokens=1).stats  # warm-up, and learn nothing else
        r = c.generate(PROMPT, max_tokens=24, ignore_eos=True)
    assert tokens["prompt_tokens"] > 0
    assert r.finish_reason == "length" and len(r.token_ids) == 24
    assert r.text.strip(), "greedy text should not be empty"
    # Parity: same weights (the file the worker chose to serve: llama_weights.py, its
    # record cached at its start), same KV mode, same chunking (whole prompt in one step).
    from tandem.common.tokenizer import TextTokenizer, tokenizer_spec_from_gguf
    from tandem.workers.backends.llama_weights import served_weights

    ids = TextTokenizer(tokenizer_spec_from_gguf(default_model_path())).encode(PROMPT)
    served, _ = served_weights(default_model_path(), "auto", threads=1)
    ref = greedy_reference(str(served), ids, 24, chunk=256, n_ctx=4096, threads=1)
    assert r.token_ids == ref


def test_streaming_yields_deltas_that_add_up_to_the_result(cluster):
    with cluster.client() as c:
        s = c.stream("Write a short poem about the sea.", max_tokens=16, ignore_eos=True)
        deltas = list(s)
        result = s.result
    # Tokens that reach the router together (one worker frame, one drain) travel
    # together: a delta holds one token or more, never none but a text tail's.
    assert 1 <= len(deltas) <= 16 and sum(len(d.token_ids) for d in deltas) == 16
    assert "".join(d.text for d in deltas) == result.text
    assert [t for d in deltas for t in d.token_ids] == result.token_ids
    st = result.stats
    for key in (
        "prompt_tokens",
        "cached_tokens",
        "output_tokens",
        "queue_s",
        "ttft_s",
        "e2e_s",
        "prefill_s",
        "decode_s",
        "worker",
    ):
        assert key in st, key
    assert 0 < st["ttft_s"] <= st["e2e_s"]
    assert st["output_tokens"] == 16 and st["worker"] == "cpu0"


def test_stop_strings_end_generation_before_the_stop_text(cluster):
    with cluster.client() as c:
        free = c.generate("Count: 1, 2, 3,", max_tokens=20, ignore_eos=True)
        assert free.text, "need some text to pick a stop string from"
        stop = free.text.strip()[:3]
        r = c.generate("Count: 1, 2, 3,", max_tokens=20, ignore_eos=True, stop=[stop])
    assert r.finish_reason == "stop"
    assert stop not in r.text


def test_concurrent_requests_are_batched_on_one_worker(cluster):
    """Eight requests at once: the worker runs 4 (its cap) together, queues the rest."""
    seen_active: list[int] = []
    seen_queued: list[int] = []
    stop = threading.Event()

    def watch() -> None:
        with cluster.client() as c:
            while not stop.is_set():
                w = c.status().workers[0]
                seen_active.append(w["active"])
                seen_queued.append(w["queued"])
                time.sleep(0.05)

    async def burst() -> list:
        async with AsyncClient(cluster.client_addr) as ac:
            jobs = [
                ac.generate(f"Story number {i}:", max_tokens=24, ignore_eos=True) for i in range(8)
            ]
            return await asyncio.gather(*jobs)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        results = asyncio.run(burst())
    finally:
        stop.set()
        watcher.join()
    assert all(len(r.token_ids) == 24 for r in results)
    assert max(seen_active) == 4, seen_active
    assert max(seen_queued) >= 1, seen_queued


def test_heartbeats_carry_per_request_load_and_cache_blocks(cluster):
    with cluster.client() as c:
        s = c.stream("Describe a forest in detail.", max_tokens=64, ignore_eos=True)
        it = iter(s)
        next(it)  # decoding has started; the next heartbeat shows it
        deadline = time.monotonic() + 2.0
        while (w := c.status().workers[0])["active"] == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        for _ in it:
            pass
        after = c.status().workers[0]
    assert w["active"] == 1
    (req,) = w["requests"]
    assert set(req) >= {"id", "prompt", "cached", "prefill_remaining", "decode_remaining"}
    assert req["prefill_remaining"] == 0 and 0 < req["decode_remaining"] < 64
    assert w["kv_capacity_tokens"] == 4096 and w["kv_used_tokens"] > 0
    assert after["cached_blocks"] > 0, "a finished request's KV is advertised as blocks"


def test_seeded_prefix_is_reused_and_cuts_ttft(cluster):
    prefix = " ".join(f"Fact {i}: the number {i} squared is {i * i}." for i in range(40))
    with cluster.client() as c:
        cold = c.generate(prefix + " Question A?", max_tokens=2, ignore_eos=True)
        seed = c.generate(prefix, prefill_only=True)
        warm = c.generate(prefix + " Question B?", max_tokens=2, ignore_eos=True)
    n = cold.stats["prompt_tokens"]
    assert n > 400
    assert seed.finish_reason == "prefill_only" and seed.token_ids == []
    assert cold.stats["cached_tokens"] == 0
    # Block-aligned (16) and at least all but the last block of the shared prefix.
    assert warm.stats["cached_tokens"] >= seed.stats["prompt_tokens"] - 16
    assert warm.stats["cached_tokens"] % 16 == 0
    assert warm.stats["router_cached_estimate"] == warm.stats["cached_tokens"]
    assert warm.stats["prefill_s"] < cold.stats["prefill_s"] / 3
    assert warm.stats["ttft_s"] < cold.stats["ttft_s"] / 3


def test_a_killed_worker_s_requests_all_finish_on_the_next_worker():
    """A streamed request whose tokens reached the client migrates: the next worker
    continues after them and the client sees one stream; requests that had shown the
    client nothing (queued on the worker, or not streamed) are routed again."""
    from tandem.launcher.cluster import Cluster, WorkerSpec

    args = LLAMA_ARGS + ["--heartbeat-s", "0.1", "--max-active", "1"]
    cluster = Cluster(workers=[WorkerSpec("doomed", args)], router_args=["--liveness-s", "1"])
    with cluster as cl, cl.client() as c:
        s = c.stream("Tell me a long story.", max_tokens=150, ignore_eos=True)
        it = iter(s)
        seen = next(it).token_ids
        results: dict[str, Any] = {}

        def later(name: str, **kw: Any) -> None:
            with cl.client() as own:
                results[name] = own.generate("Hello", max_tokens=3, **kw)

        waiting = [
            threading.Thread(target=later, args=("queued",)),
            threading.Thread(target=later, args=("buffered",), kwargs={"stream": False}),
        ]
        for t in waiting:
            t.start()
        deadline = time.monotonic() + 10
        while c.status().requests_in_flight < 3 and time.monotonic() < deadline:
            time.sleep(0.05)  # both are assigned to doomed, queued behind the story
        cl.kill("doomed")
        cl.start_worker(WorkerSpec("phoenix", LLAMA_ARGS))
        for _ in it:
            pass
        story = s.result
        assert story.token_ids[: len(seen)] == seen and len(story.token_ids) == 150
        assert story.stats["rerouted_from"] == ["doomed"] and story.stats["worker"] == "phoenix"
        assert story.stats["migrated_tokens"] >= len(seen)
        for t in waiting:
            t.join(timeout=60)
        for name in ("queued", "buffered"):
            assert results[name].worker == "phoenix", name
            assert results[name].stats["rerouted_from"] == ["doomed"]
            assert len(results[name].token_ids) == 3
        assert c.generate("Hello", max_tokens=3).worker == "phoenix"


def test_client_retries_are_safe_when_the_router_is_slow_to_appear(tmp_path):
    """A request sent before any worker exists waits at the router, then runs."""
    from tandem.launcher.cluster import Cluster, WorkerSpec

    with Cluster(workers=[]) as cl:
        done: list = []
        with Client(cl.client_addr, connect_timeout_s=1.0) as c:
            t = threading.Thread(target=lambda: done.append(c.generate("Hi", max_tokens=2)))
            t.start()
            time.sleep(1.5)
            cl.start_worker(WorkerSpec("late", LLAMA_ARGS))
            t.join(timeout=60)
        assert done and done[0].worker == "late"
        with cl.client() as c2:
            assert c2.status().requests_in_flight == 0


def test_two_workers_attached_and_both_used():
    from tandem.launcher.cluster import Cluster, WorkerSpec

    workers = [WorkerSpec("a", LLAMA_ARGS), WorkerSpec("b", LLAMA_ARGS)]
    with Cluster(workers=workers, router_args=["--policy", "round_robin"]) as cl:

        async def burst() -> list:
            async with AsyncClient(cl.client_addr) as ac:
                return await asyncio.gather(
                    *[ac.generate(f"Item {i}", max_tokens=4) for i in range(4)]
                )

        results = asyncio.run(burst())
        with cl.client() as c:
            rows = {w["id"]: w for w in c.status().workers}
            pinned = c.generate("Pinned", max_tokens=2, worker="b")
    assert sorted(r.worker for r in results) == ["a", "a", "b", "b"]
    assert rows["a"]["routed_total"] == 2 and rows["b"]["routed_total"] == 2
    assert pinned.worker == "b"
