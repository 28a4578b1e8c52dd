"""Does a llama.cpp decode step slow with the cells its pool holds for other sequences?

    python studies/held_cells.py --device cpu --threads 2 --held 0,1024,4096,8192 --out held.json
    python studies/held_cells.py --device gpu --threads 1 --held 0,16384,65536,262144 \
        --batches 1,4,16 --unit 2048

The pool is unified (workers/backends/llama.py): every sequence's cells share it, and
a decode step computes attention over the pool's used span (masked), not only over
its own rows' cells. A worker's prefix cache keeps finished requests' cells there, so
a worker that served a while decodes with many cells held, while its start-up
measurement (workers/startup.py) decodes in an empty pool. This study prices that
difference: per batch size and number of held cells, the median decode step of
``batch`` rows after a shared ``--context``-token prompt (as the seed preset's
rows decode), through the real Engine, with ``held`` cells restored into sequences
of their own below them (host-tier restores: a copy, not a prefill). Held levels are
interleaved per round (``--rounds``), their order reversed every other round, so that
the machine's load moves under all of them alike.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

from tandem.common.model_files import default_model_path
from tandem.common.protocol import SamplingParams
from tandem.workers.backends.llama import LlamaBackend
from tandem.workers.backends.llama_state import SeqState
from tandem.workers.config import EngineConfig
from tandem.workers.engine import Engine
from tandem.workers.profiler import SKIP_STEPS, _Collector
from tandem.workers.request import Request, Status

FIRST_ID = 256  # random prompts avoid control tokens


def prompt(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(FIRST_ID, vocab) for _ in range(n)]


def filler(backend: LlamaBackend, tokens: int, rng: random.Random) -> SeqState:
    """One ``tokens``-token sequence's saved cells: what each held unit restores."""
    cfg = EngineConfig(max_active=1, step_tokens=backend.batch_cap, cache_tokens=tokens + 1)
    engine = Engine(backend, cfg, _Collector(), "held")
    engine.submit(Request("fill", prompt(rng, tokens, backend.vocab_size),
                          SamplingParams(max_tokens=1, prefill_only=True)))  # fmt: skip
    while engine.queue or engine.active:
        engine.step()
    (entry,) = engine.cache.entries.values()
    state = backend.save(entry.handle)
    for handle in engine.cache.clear():
        backend.free(handle)
    assert state is not None, "llama.cpp gave no state"
    return state


def decode_steps(
    backend: LlamaBackend, batch: int, context: int, steps: int, rng: random.Random
) -> list[float]:
    """Seconds of each decode step while all ``batch`` rows decode together."""
    cfg = EngineConfig(max_active=batch, step_tokens=backend.batch_cap,
                       cache_tokens=context + backend.batch_cap)  # fmt: skip
    engine = Engine(backend, cfg, _Collector(), "held")
    prefix = prompt(rng, context - batch, backend.vocab_size)
    params = SamplingParams(max_tokens=steps + SKIP_STEPS + batch + 1, ignore_eos=True)
    for i in range(batch):
        engine.submit(Request(f"d{i}", [*prefix, *prompt(rng, 1 + i, backend.vocab_size)], params))
    while len(engine.active) < batch or any(r.status is not Status.DECODE for r in engine.active):
        if not engine.queue and len(engine.active) < batch:
            raise RuntimeError(f"{len(engine.active)} of {batch} rows decode: n_ctx too small?")
        engine.step()
    times = []
    while len(engine.active) == batch:
        t0 = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t0)
    while engine.queue or engine.active:
        engine.step()
    for handle in engine.cache.clear():
        backend.free(handle)
    return times[SKIP_STEPS:]


def measure(args: argparse.Namespace) -> dict[str, Any]:
    held_levels = [int(x) for x in args.held.split(",")]
    batches = [int(x) for x in args.batches.split(",")]
    most = max(held_levels)
    units = -(-most // args.unit)
    n_ctx = max(args.unit + 64, 2 * max(batches) * (args.context + args.steps + 64))
    pool = units * args.unit + args.context + args.step_tokens
    backend = LlamaBackend(args.model or default_model_path(), n_ctx=n_ctx, threads=args.threads,
                           max_active=max(batches), cache_entries=units + 2, device=args.device,
                           step_tokens=args.step_tokens, cache_tokens=pool)  # fmt: skip
    rng = random.Random(7)
    state = filler(backend, args.unit, rng)
    samples: dict[tuple[int, int], list[float]] = {}
    for r in range(args.rounds):
        for held in held_levels if r % 2 == 0 else held_levels[::-1]:
            handles = [backend.restore(state) for _ in range(held // args.unit)]
            if any(h is None for h in handles):
                raise RuntimeError(f"no room to hold {held} cells")
            for b in batches:
                med = statistics.median(decode_steps(backend, b, args.context, args.steps, rng))
                samples.setdefault((held, b), []).append(med)
                print(f"round {r} held {held} batch {b}: {1000 * med:.3f} ms", flush=True)
            for h in handles:
                assert h is not None
                backend.free(h)
    rows = []
    for b in batches:
        base = statistics.median(samples[(held_levels[0], b)])
        for held in held_levels:
            ms = statistics.median(samples[(held, b)])
            each = [round(1000 * x, 3) for x in samples[(held, b)]]
            rows.append({"batch": b, "held": held, "step_ms": round(1000 * ms, 3),
                         "least_ms": min(each),
                         "vs_first": round(ms / base, 3), "rounds_ms": each})  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
    backend.close()
    keys = ("device", "threads", "context", "unit", "steps", "rounds")
    return {**{k: getattr(args, k) for k in keys}, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model", default=None, help="a GGUF (default: the embedded model)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--held", default="0,1024,4096,8192", help="cells held, a comma list")
    ap.add_argument("--batches", default="1,4")
    ap.add_argument("--context", type=int, default=512, help="tokens each row decodes after")
    ap.add_argument("--unit", type=int, default=1024, help="cells per held sequence")
    ap.add_argument("--steps", type=int, default=16, help="decode steps timed per case")
    ap.add_argument("--step-tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    doc = measure(args)
    if args.out:
        args.out.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
