"""``tandem profile``: measure a backend in isolation and store its rates."""

from __future__ import annotations

import json
import os
from typing import Any

import click

from tandem.cli.options import sim_profile
from tandem.cli.tables import render
from tandem.workers.backends import BACKENDS


@click.command()
@click.option("--backend", type=click.Choice(BACKENDS), default="llama.cpp")
@click.option("--model", type=click.Path(exists=True), default=None, help="Default: embedded.")
@click.option("--device", default="auto", show_default=True)
@click.option(
    "--threads",
    type=int,
    default=0,
    show_default=True,
    help="llama.cpp threads; 0: as tandem worker chooses (the cores less one).",
)
@click.option("--max-active", type=int, default=4, show_default=True)
@click.option("--n-ctx", type=int, default=None, help="KV cells [default: what profiling needs].")
@click.option("--step-tokens", type=int, default=256, show_default=True)
@sim_profile
@click.option("--prompt-tokens", type=int, default=512, show_default=True)
@click.option("--decode-tokens", type=int, default=32, show_default=True)
@click.option(
    "--decode-context",
    type=int,
    default=None,
    help="Prompt tokens before decoding [default: --prompt-tokens].",
)
@click.option(
    "--repeats", type=int, default=3, show_default=True, help="Samples per batch size (>= 3)."
)
@click.option(
    "--repair/--refuse",
    default=True,
    show_default=True,
    help="Repair decode points far off their neighbours or falling with batch size "
    "(monotone fit), or refuse to save such a profile.",
)
@click.option(
    "--save/--no-save",
    default=True,
    show_default=True,
    help="Store the result where workers look for their rates.",
)
@click.option("--json", "as_json", is_flag=True)
def profile(
    backend: str,
    model: str | None,
    device: str,
    threads: int,
    max_active: int,
    n_ctx: int | None,
    step_tokens: int,
    profile_file: str | None,
    prompt_tokens: int,
    decode_tokens: int,
    decode_context: int | None,
    repeats: int,
    repair: bool,
    save: bool,
    as_json: bool,
) -> None:
    """Measure a worker's backend in isolation (no router) and store its rates."""
    from tandem.workers.backends import build_backend
    from tandem.workers.config import EngineConfig, WorkerConfig
    from tandem.workers.profiler import kv_cells_needed, profile_backend
    from tandem.workers.profiles import save_profile

    need = kv_cells_needed(max_active, prompt_tokens, decode_tokens, decode_context)
    try:
        engine = EngineConfig(max_active=max_active, step_tokens=step_tokens)
        cfg = WorkerConfig(
            router="inproc://unused",
            backend=backend,
            model=model,
            device=device,
            threads=threads,
            n_ctx=n_ctx or max(4096, need),
            engine=engine,
            profile=profile_file,
        )
        be = build_backend(cfg)
        click.echo(f"profiling {be.name} on {be.device} ({be.model_name})...", err=True)
        _warn_if_busy(cfg.threads if backend == "llama.cpp" else 1)
        result = profile_backend(
            be, max_active, prompt_tokens, decode_tokens, repeats, step_tokens, 0, decode_context
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    doc = result.to_json()
    for line in result.decode_repaired:
        click.echo(f"{'repaired' if repair else 'suspicious'}: {line}", err=True)
    if result.decode_repaired and not repair:
        click.echo("refusing to save: re-profile on an idle machine, or pass --repair", err=True)
        raise SystemExit(1)
    if save:
        doc["path"] = str(save_profile(result.backend, result.device, result.model, doc))
    if as_json:
        click.echo(json.dumps(doc))
    else:
        click.echo(profile_table(doc), err=True)


def profile_table(doc: dict[str, Any]) -> str:
    """The human-readable report of ``tandem profile``."""
    sim = " (SIMULATED: the profile file played back)" if doc.get("simulated") else ""
    lines = [
        f"{doc['backend']} on {doc['device']}, model {doc['model']}{sim}",
        f"cold prefill ({doc['prompt_tokens']} tokens): {doc['prefill_tok_s']:.1f} tok/s",
    ]
    fitted = doc["decode_tok_s"]
    medians = doc.get("decode_median_tok_s") or fitted
    spread = doc.get("decode_spread") or [0.0] * len(fitted)
    rows = [
        [b, m, f"{100 * s:.0f}%", x, x / b, 1000 * b / x]
        for b, (m, s, x) in enumerate(zip(medians, spread, fitted, strict=True), 1)
    ]
    repeats = doc.get("repeats", 1)
    lines.append(
        f"decode after {doc.get('decode_context', '?')}-token prompts, {repeats} runs each:"
    )
    headers = ["batch", "median tok/s", "spread", "fitted tok/s", "per request", "step ms"]
    lines.append(render(headers, rows))
    if doc.get("path"):
        lines.append(f"saved to {doc['path']}")
    return "\n".join(lines)


def _warn_if_busy(threads: int) -> None:
    """Other processes on the cores a backend spins on make it look many times slower
    (llama.cpp's thread barriers degrade badly when oversubscribed)."""
    cores = os.cpu_count() or 1
    load = os.getloadavg()[0]
    if load + threads > cores + 0.5:
        click.echo(
            f"warning: load average {load:.1f} on {cores} cores; the measurement will be "
            "low while other processes run (profile an idle machine)",
            err=True,
        )
