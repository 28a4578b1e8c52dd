"""tandem's MLX worker vs a raw mlx-lm loop, side by side in one run.

Measures cold prefill tok/s for a 512-token prompt and aggregate decode tok/s at
several batch sizes, (a) with mlx-lm's own ``BatchGenerator`` in this process and
(b) through a real tandem cluster (router + one MLX worker process). Same model
file, same device, same token counts.

    python studies/mlx_compare.py --device gpu --batches 1,2,4,8,16 --out RESULT.md
"""

from __future__ import annotations

import asyncio
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import click

from tandem.cli.options import out_file_option
from tandem.client import AsyncClient
from tandem.common.model_files import default_model_path
from tandem.launcher.cluster import Cluster, WorkerSpec


def raw_mlx(
    model_path: str, device: str, batches: list[int], n_out: int, prompt_len: int, repeats: int
) -> dict[str, list[float]]:
    """mlx-lm's BatchGenerator: prefill tok/s (batch 1) and decode tok/s per batch size."""
    import mlx.core as mx
    from mlx_lm.generate import BatchGenerator

    from tandem.workers.backends.mlx.model import load_mlx_model

    mx.set_default_device(mx.gpu if device == "gpu" else mx.cpu)
    model, _spec, _cfg = load_mlx_model(model_path)
    out: dict[str, list[float]] = {"prefill": []}
    prompt = [(i * 7919) % 40000 + 100 for i in range(prompt_len)]
    for _ in range(repeats):
        gen = BatchGenerator(model, max_tokens=1, prefill_step_size=prompt_len)
        gen.insert([prompt], max_tokens=[1])
        t0 = time.perf_counter()
        while True:  # one token out means the whole prompt went through the model
            _, responses = gen.next()
            if responses:
                break
        out["prefill"].append(prompt_len / (time.perf_counter() - t0))
        gen.close()
        for b in batches:
            out.setdefault(f"decode{b}", []).append(_raw_decode(model, b, n_out))
    return out


def _raw_decode(model: Any, batch: int, n_out: int) -> float:  # model: an mlx-lm model
    from mlx_lm.generate import BatchGenerator

    gen = BatchGenerator(
        model,
        max_tokens=n_out,
        completion_batch_size=max(batch, 1),
        prefill_batch_size=max(batch, 1),
    )
    prompts = [[100 + i, 200 + i, 300 + i, 400 + i] for i in range(batch)]
    gen.insert(prompts, max_tokens=[n_out] * batch)
    counts: dict[int, int] = {}
    t_first, at_first = 0.0, 0
    while len(counts) < batch or min(counts.values()) < n_out:
        _, responses = gen.next()
        for r in responses:
            counts[r.uid] = counts.get(r.uid, 0) + 1
        if not t_first and len(counts) == batch:
            # Every sequence has its first token: from here on it is pure decode.
            t_first, at_first = time.perf_counter(), sum(counts.values())
    gen.close()
    return (sum(counts.values()) - at_first) / (time.perf_counter() - t_first)


async def _burst(addr: str, batch: int, n_out: int, prompt_len: int) -> list:
    async with AsyncClient(addr) as ac:
        jobs = [
            ac.generate(
                tokens=[100 + i, 200 + i, 300 + i, 400 + i][: max(1, prompt_len)],
                max_tokens=n_out,
                ignore_eos=True,
            )
            for i in range(batch)
        ]
        return await asyncio.gather(*jobs)


def tandem_mlx(
    device: str, batches: list[int], n_out: int, prompt_len: int, repeats: int
) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"prefill": []}
    args = [
        "--backend",
        "mlx",
        "--device",
        device,
        "--max-active",
        str(max(batches)),
        "--step-tokens",
        "1024",
        "--heartbeat-s",
        "0.5",
    ]
    with Cluster(workers=[WorkerSpec("mlx0", args)], start_timeout_s=300) as cl:
        with cl.client() as c:
            c.generate(tokens=[1, 2, 3, 4, 5, 6, 7, 8], max_tokens=2)  # warm-up
        for rep in range(repeats):
            # A fresh prompt each time: the worker's prefix cache must not help.
            prompt = [(i * 7919 + rep * 104729) % 40000 + 100 for i in range(prompt_len)]
            with cl.client() as c:
                r = c.generate(tokens=prompt, max_tokens=1)
            out["prefill"].append(prompt_len / r.stats["prefill_s"])
            for b in batches:
                t0 = time.perf_counter()
                results = asyncio.run(_burst(cl.client_addr, b, n_out, 4))
                wall = time.perf_counter() - t0
                ttft = max(x.stats["ttft_s"] for x in results)
                out.setdefault(f"decode{b}", []).append(b * (n_out - 1) / (wall - ttft))
    return out


@click.command()
@click.option("--device", type=click.Choice(["gpu", "cpu"]), default="gpu")
@click.option("--batches", default="1,2,4,8,16")
@click.option("--n-out", type=int, default=128)
@click.option("--prompt-len", type=int, default=512)
@click.option("--repeats", type=int, default=3)
@out_file_option()
def main(
    device: str, batches: str, n_out: int, prompt_len: int, repeats: int, out: str | None
) -> None:
    sizes = [int(x) for x in batches.split(",")]
    model = str(default_model_path())
    raw = raw_mlx(model, device, sizes, n_out, prompt_len, repeats)
    tan = tandem_mlx(device, sizes, n_out, prompt_len, repeats)
    lines = [
        "# tandem's MLX worker vs a raw mlx-lm loop",
        "",
        f"Device: MLX {device} on {platform.node() or platform.machine()}; model "
        f"{Path(model).name}; {n_out} output tokens (EOS ignored); median of {repeats} runs. "
        f"Command: `python studies/mlx_compare.py --device {device} --batches {batches} "
        f"--n-out {n_out} --prompt-len {prompt_len} --repeats {repeats}`.",
        "",
        "| measure | raw mlx-lm | tandem | tandem / raw |",
        "| --- | --- | --- | --- |",
    ]
    for key in ["prefill"] + [f"decode{b}" for b in sizes]:
        r, t = statistics.median(raw[key]), statistics.median(tan[key])
        label = (
            f"cold prefill, {prompt_len} tokens (tok/s)"
            if key == "prefill"
            else (f"decode, {key[6:]} active (aggregate tok/s)")
        )
        lines.append(f"| {label} | {r:,.0f} | {t:,.0f} | {t / r:.2f} |")
    report = "\n".join(lines) + "\n"
    click.echo(report)
    if out:
        Path(out).write_text(report)


if __name__ == "__main__":
    main()
