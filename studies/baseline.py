"""Baseline numbers: tandem's llama.cpp worker vs a direct llama.cpp loop, side by side.

Measures, in one run on one machine:
- cold vs warm-prefix TTFT for a ~500-token shared prefix (through tandem);
- aggregate decode tok/s at 1 and 4 concurrent requests, through tandem and
  through a raw low-level llama.cpp loop with the same threads and KV mode.

    python studies/baseline.py --threads 2 --out docs/results/baseline-cpu.md
"""

from __future__ import annotations

import asyncio
import platform
import statistics
import time
from pathlib import Path

import click
import numpy as np

from tandem.cli.options import out_file_option
from tandem.client import AsyncClient
from tandem.common.model_files import default_model_path
from tandem.common.protocol import SamplingParams
from tandem.common.tokenizer import TextTokenizer, tokenizer_spec_from_gguf
from tandem.launcher.cluster import Cluster, WorkerSpec

PREFIX = " ".join(
    f"Record {i}: sensor {i % 7} read {i * 13 % 97} units at noon." for i in range(36)
)


def raw_decode_tok_s(model: str, threads: int, batch: int, n_out: int, prompt: list[int]) -> float:
    """Aggregate decode tok/s of ``batch`` sequences decoded together, raw llama.cpp."""
    import llama_cpp as L

    L.llama_backend_init()
    m = L.llama_model_load_from_file(model.encode(), L.llama_model_default_params())
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = 8192, 256, 256, batch
    cp.n_threads = cp.n_threads_batch = threads
    cp.kv_unified = True
    ctx = L.llama_init_from_model(m, cp)
    vocab = L.llama_model_get_vocab(m)
    n_vocab = L.llama_vocab_n_tokens(vocab)
    b = L.llama_batch_init(256, 0, 1)

    def step(rows: list[tuple[int, int, int, bool]]) -> None:
        for i, (tok, pos, seq, logits) in enumerate(rows):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = tok, pos, 1, int(logits)
            b.seq_id[i][0] = seq
        b.n_tokens = len(rows)
        assert L.llama_decode(ctx, b) == 0

    def argmax(i: int) -> int:  # numpy, so the raw loop pays no Python-per-logit cost
        ptr = L.llama_get_logits_ith(ctx, i)
        return int(np.ctypeslib.as_array(ptr, shape=(n_vocab,)).argmax())

    try:
        for s in range(batch):
            step([(t, p, s, p == len(prompt) - 1) for p, t in enumerate(prompt)])
        last = [argmax(-1)] * batch
        t0 = time.perf_counter()
        for k in range(n_out):
            step([(last[s], len(prompt) + k, s, True) for s in range(batch)])
            last = [argmax(s) for s in range(batch)]
        return batch * n_out / (time.perf_counter() - t0)
    finally:
        L.llama_batch_free(b)
        L.llama_free(ctx)
        L.llama_model_free(m)


def engine_decode_tok_s(
    model: str, threads: int, batch: int, n_out: int, prompt: list[int]
) -> float:
    """The worker's engine + llama.cpp backend in this process: no sockets, no router."""
    from tandem.workers.backends.llama import LlamaBackend
    from tandem.workers.engine import Engine, EngineConfig
    from tandem.workers.request import Request

    backend = LlamaBackend(model, n_ctx=8192, threads=threads, max_active=4)
    try:
        engine = Engine(backend, EngineConfig(), lambda msg: None, "bench")
        for i in range(batch):
            engine.submit(
                Request(f"r{i}", prompt + [i], SamplingParams(max_tokens=n_out, ignore_eos=True))
            )
        engine.step()  # every prompt's prefill (they fit one step) and first tokens
        t0 = time.perf_counter()
        while engine.active or engine.queue:
            engine.step()
        return batch * (n_out - 1) / (time.perf_counter() - t0)
    finally:
        backend.close()


async def _burst(addr: str, prompts: list[str], n_out: int) -> list:
    async with AsyncClient(addr) as ac:
        return await asyncio.gather(
            *[ac.generate(pr, max_tokens=n_out, ignore_eos=True) for pr in prompts]
        )


def tandem_decode_tok_s(cl: Cluster, batch: int, n_out: int) -> float:
    """Aggregate decode tok/s: output tokens after the first / the span they took."""
    t0 = time.perf_counter()
    results = asyncio.run(_burst(cl.client_addr, [f"Story {i}:" for i in range(batch)], n_out))
    wall = time.perf_counter() - t0
    ttft = max(r.stats["ttft_s"] for r in results)
    return batch * (n_out - 1) / (wall - ttft)


def ttft_pair(cl: Cluster) -> tuple[float, float, int, int]:
    with cl.client() as c:
        cold = c.generate(PREFIX + " Question: which sensor?", max_tokens=1)
        warm = c.generate(PREFIX + " Question: which reading?", max_tokens=1)
    return (
        cold.stats["ttft_s"],
        warm.stats["ttft_s"],
        cold.stats["prompt_tokens"],
        warm.stats["cached_tokens"],
    )


@click.command()
@click.option("--threads", type=int, default=2)
@click.option("--n-out", type=int, default=64)
@click.option("--repeats", type=click.IntRange(min=1), default=3)
@out_file_option()
def main(threads: int, n_out: int, repeats: int, out: str | None) -> None:
    model = str(default_model_path())
    prompt_ids = TextTokenizer(tokenizer_spec_from_gguf(model)).encode("Story 0:")
    keys = ("cold", "warm", "raw1", "raw4", "eng1", "eng4", "tan1", "tan4")
    rows: dict[str, list[float]] = {k: [] for k in keys}
    args = ["--threads", str(threads), "--max-active", "4", "--heartbeat-s", "0.5"]
    n_prompt = n_cached = 0  # the prompt's size and cached part, as the last repeat saw them
    for _ in range(repeats):
        # Side by side, alternating, so drift on a noisy machine hits both alike.
        rows["raw1"].append(raw_decode_tok_s(model, threads, 1, n_out, prompt_ids))
        rows["raw4"].append(raw_decode_tok_s(model, threads, 4, n_out, prompt_ids))
        rows["eng1"].append(engine_decode_tok_s(model, threads, 1, n_out, prompt_ids))
        rows["eng4"].append(engine_decode_tok_s(model, threads, 4, n_out, prompt_ids))
        with Cluster(workers=[WorkerSpec("cpu0", args)]) as cl:
            cold, warm, n_prompt, n_cached = ttft_pair(cl)
            rows["cold"].append(cold)
            rows["warm"].append(warm)
            rows["tan1"].append(tandem_decode_tok_s(cl, 1, n_out))
            rows["tan4"].append(tandem_decode_tok_s(cl, 4, n_out))
    med = {k: statistics.median(v) for k, v in rows.items()}
    report = _report(med, rows, threads, n_out, n_prompt, n_cached)
    click.echo(report)
    if out:
        Path(out).write_text(report)


def _report(
    med: dict[str, float], rows: dict[str, list[float]], threads: int, n_out: int,
    n_prompt: int, n_cached: int,
) -> str:  # fmt: skip
    def cell(k: str) -> str:
        return f"{med[k]:.3g} ({', '.join(f'{x:.3g}' for x in rows[k])})"

    return "\n".join(
        [
            "# Baseline: tandem's llama.cpp worker vs a direct llama.cpp loop",
            "",
            f"Machine: {platform.processor() or platform.machine()}, {threads} threads; "
            f"model SmolLM2-135M-Instruct Q4_1; unified KV; median of {len(rows['cold'])} runs "
            "(all runs in parentheses). Command: "
            f"`python studies/baseline.py --threads {threads} --n-out {n_out}`.",
            "",
            "| measure | value |",
            "| --- | --- |",
            f"| TTFT cold, {n_prompt}-token prompt (s) | {cell('cold')} |",
            f"| TTFT warm, {n_cached} of {n_prompt} tokens cached (s) | {cell('warm')} |",
            f"| cold / warm TTFT | {med['cold'] / med['warm']:.1f}x |",
            f"| decode tok/s, 1 active, raw loop | {cell('raw1')} |",
            f"| decode tok/s, 1 active, tandem engine in-process | {cell('eng1')} |",
            f"| decode tok/s, 1 active, tandem (router + worker processes) | {cell('tan1')} |",
            f"| decode tok/s, 4 active, raw loop (aggregate) | {cell('raw4')} |",
            f"| decode tok/s, 4 active, tandem engine in-process | {cell('eng4')} |",
            f"| decode tok/s, 4 active, tandem processes (aggregate) | {cell('tan4')} |",
            f"| tandem / raw, batch 1 | {med['tan1'] / med['raw1']:.2f} |",
            f"| tandem / raw, batch 4 | {med['tan4'] / med['raw4']:.2f} |",
            "",
        ]
    )


if __name__ == "__main__":
    main()
