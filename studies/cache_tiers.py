"""The prefix cache's tiers on a real llama.cpp worker (the embedded SmolLM2-135M, this CPU).

    python studies/cache_tiers.py speed --out speed.json
    python studies/cache_tiers.py conversation --out conversation.json

``speed``: side by side in one process, per prefix length: prefill (``llama_decode``
of the tokens), save (``llama_state_seq_get_data``) and restore
(``llama_state_seq_set_data``) seconds and tokens a second, the saved bytes a
token; and a batch-1 decode step with and without 4,096 other cells held in
the pool, two contexts alternated step by step (``decode``: that alone).

``conversation``: multi-turn conversations through the real engine and backend (no
router: one worker), each turn's prompt the previous turn's prompt, its output and
a new user message, conversations interleaved so that the device tier overflows.
Per cache configuration: the fraction of prompt tokens served from the cache (and
from which tier), TTFT (queue + prefill) mean / p50 / max, and memory held against
the budget.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp as L

from tandem.common import protocol as p
from tandem.common.model_files import default_model_path
from tandem.workers.backends import llama_state
from tandem.workers.backends.llama import LlamaBackend
from tandem.workers.config import EngineConfig
from tandem.workers.engine import Engine
from tandem.workers.memory import kv_bytes_per_token
from tandem.workers.prefix_cache import DEVICE, HOST
from tandem.workers.request import Request

_IDS = range(1000, 40000)


def _feed(b: LlamaBackend, seq: int, tokens: list[int], pos0: int, chunk: int) -> None:
    for start in range(0, len(tokens), chunk):
        part = tokens[start : start + chunk]
        n = 0
        for i, t in enumerate(part):
            n = b._put(n, t, pos0 + start + i, seq, i == len(part) - 1)
        b.batch.n_tokens = n
        if L.llama_decode(b.ctx, b.batch) != 0:
            raise RuntimeError("llama_decode failed")


def speed(lengths: list[int], threads: int, repeats: int) -> dict[str, Any]:
    chunk = 256
    b = LlamaBackend(default_model_path(), n_ctx=8192, threads=threads, max_active=4,
                     cache_entries=24, step_tokens=chunk)  # fmt: skip
    b.free_seqs.remove(0)  # sequence 0 is prefilled below; restores go to the next id
    rng = random.Random(7)
    rows = []
    for n in lengths:
        best: dict[str, float] = {}
        for _ in range(repeats):
            tokens = rng.choices(_IDS, k=n)
            L.llama_memory_clear(b.mem, True)
            t = time.perf_counter()
            _feed(b, 0, tokens, 0, chunk)
            prefill = time.perf_counter() - t
            t = time.perf_counter()
            state = llama_state.save(b, 0)
            save = time.perf_counter() - t
            assert state is not None and state.n_tokens == n
            t = time.perf_counter()
            seq = llama_state.restore(b, state)
            restore = time.perf_counter() - t
            assert seq == 1 and L.llama_memory_seq_pos_max(b.mem, 1) == n - 1
            b.free(seq)
            for k, v in (("prefill_s", prefill), ("save_s", save), ("restore_s", restore)):
                best[k] = min(best.get(k, v), v)
            best["bytes_per_token"] = state.nbytes / n
        rows.append({"tokens": n, **best,
                     "prefill_tok_s": n / best["prefill_s"], "save_tok_s": n / best["save_s"],
                     "restore_tok_s": n / best["restore_s"],
                     "restore_vs_prefill": best["prefill_s"] / best["restore_s"]})  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
    b.close()
    decode = decode_with_cells_held(threads)
    print(json.dumps(decode), flush=True)
    shape = kv_bytes_per_token(default_model_path())
    return {"threads": threads, "kv_bytes_per_token_shape": shape, "rows": rows,
            "decode": decode}  # fmt: skip


def decode_with_cells_held(threads: int, held: int = 4096, steps: int = 40) -> dict[str, Any]:
    """A batch-1 decode step with and without ``held`` cells of other sequences (cache
    entries) in the pool: two contexts, the same sequence, alternated step by step so
    that the machine's load moves under both alike. Median and least, in ms."""
    rng = random.Random(5)

    def context() -> LlamaBackend:
        return LlamaBackend(default_model_path(), n_ctx=8192, threads=threads, max_active=4,
                            cache_entries=24, step_tokens=256)  # fmt: skip

    bare, full = context(), context()
    _feed(full, 2, rng.choices(_IDS, k=256), 0, 256)
    state = llama_state.save(full, 2)  # 256 cells, copied into sequences of their own
    assert state is not None
    L.llama_memory_seq_rm(full.mem, 2, -1, -1)
    for k in range(held // 256):  # a restore takes free cells: ``held`` cells held
        got = L.llama_state_seq_set_data(full.ctx, state.data, state.nbytes, 3 + k)
        assert got == state.nbytes, "no room or no such sequence"
    prompt = rng.choices(_IDS, k=64)
    times: dict[str, list[float]] = {"none": [], "held": []}
    for b in (bare, full):
        _feed(b, 0, prompt, 0, 256)
    for i in range(steps):
        token = rng.choice(_IDS)
        pair = [("none", bare), ("held", full)]
        for name, b in pair if i % 2 else pair[::-1]:
            t = time.perf_counter()
            _feed(b, 0, [token], 64 + i, 256)
            times[name].append(time.perf_counter() - t)
    bare.close()
    full.close()
    out = {f"{k}_{f.__name__}_ms": 1000 * f(v) for k, v in times.items()
           for f in (statistics.median, min)}  # fmt: skip
    return {"cells_held": held, "steps": steps, **out}


CONFIGS: dict[str, dict[str, Any]] = {  # name -> EngineConfig cache fields
    "today": {"cache_tokens": 4096, "cache_entries": 16, "cache_policy": "lru"},
    "small-device": {"cache_tokens": 512, "cache_policy": "lru"},
    "small-device+host": {"cache_tokens": 512, "host_cache_tokens": 100_000},
    "default": {"cache_tokens": 4096, "host_cache_tokens": 100_000},
}


@dataclass(frozen=True)
class Shape:
    """A conversation: a shared system prompt, then per turn a user message and a reply."""

    convs: int = 8
    turns: int = 4
    system: int = 48
    user: int = 40
    output: int = 16


def conversation(names: list[str], shape: Shape, threads: int, rounds: int) -> list[dict]:
    """Every configuration in turn, ``rounds`` times over (interleaved: the machine's
    load moves under a run, and each round sees it alike)."""
    rows = []
    for name in [n for _ in range(rounds) for n in names]:
        fields = CONFIGS[name]
        backend = LlamaBackend(default_model_path(), n_ctx=4096, threads=threads, max_active=4,
                               cache_entries=None, step_tokens=128,
                               cache_tokens=fields["cache_tokens"])  # fmt: skip
        out: list[p.Message] = []
        cfg = EngineConfig(max_active=4, step_tokens=128, max_tokens_limit=64, **fields)
        engine = Engine(backend, cfg, out.append, "w")
        rows.append(_converse(name, engine, out, shape))
        print(json.dumps(rows[-1]), flush=True)
        backend.close()
    return rows


def _converse(name: str, engine: Engine, out: list, shape: Shape) -> dict[str, Any]:
    backend: Any = engine.backend  # the LlamaBackend, with restore
    convs, turns = shape.convs, shape.turns
    rng = random.Random(11)
    system = rng.choices(_IDS, k=shape.system)  # every conversation starts with it
    history = [system + rng.choices(_IDS, k=shape.user) for _ in range(convs)]
    ttft, cached, total, restored = [], 0, 0, [0]
    restore = backend.restore

    def counted(state: Any) -> Any:  # the host tier's restores, for the row
        restored[0] += state.n_tokens
        return restore(state)

    backend.restore = counted
    t0 = time.perf_counter()
    for turn in range(turns):
        for c in range(convs):
            sampling = p.SamplingParams(max_tokens=shape.output, temperature=0.0,
                                        ignore_eos=True)  # fmt: skip
            engine.submit(Request(f"c{c}t{turn}", list(history[c]), sampling))
        while engine.queue or engine.active:
            engine.step()
        done = {m.request_id: m for m in out if isinstance(m, p.Done)}
        for c in range(convs):
            st = done[f"c{c}t{turn}"].stats
            ttft.append((st.worker_queue_s or 0.0) + (st.prefill_s or 0.0))
            cached += st.cached_tokens or 0
            total += st.prompt_tokens or 0
            output = [t for m in out if isinstance(m, p.TokenDelta)
                      and m.request_id == f"c{c}t{turn}" for t in m.token_ids]  # fmt: skip
            history[c] = history[c] + output + rng.choices(_IDS, k=shape.user)
        out.clear()
    cache = engine.cache
    bpt = kv_bytes_per_token(default_model_path())
    return {
        "config": name, "shape": shape.__dict__, "wall_s": time.perf_counter() - t0,
        "cached_frac": cached / total, "prompt_tokens": total, "restored_tokens": restored[0],
        "ttft_mean_s": statistics.mean(ttft), "ttft_p50_s": statistics.median(ttft),
        "ttft_max_s": max(ttft),
        "device": {"capacity_tokens": cache.capacity[DEVICE], "held_tokens": cache.held[DEVICE]},
        "host": {"capacity_bytes": cache.capacity[HOST] * bpt,
                 "held_bytes": sum(e.handle.nbytes for e in cache.entries.values()
                                   if e.tier == HOST)},
    }  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("speed", "decode", "conversation"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lengths", default="128,512,1024")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--config", action="append", help=f"conversation: of {list(CONFIGS)}")
    ap.add_argument("--conversations", type=int, default=8)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--system", type=int, default=48, help="tokens of the shared system prompt")
    ap.add_argument("--user", type=int, default=40, help="tokens of each user message")
    ap.add_argument("--output", type=int, default=16, help="tokens of each reply")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    if args.what == "speed":
        lengths = [int(x) for x in args.lengths.split(",")]
        doc: Any = speed(lengths, args.threads, args.repeats)
    elif args.what == "decode":
        doc = decode_with_cells_held(args.threads)
        print(json.dumps(doc))
    else:
        shape = Shape(args.conversations, args.turns, args.system, args.user, args.output)
        doc = conversation(args.config or list(CONFIGS), shape, args.threads, args.rounds)
    if args.out:
        args.out.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
