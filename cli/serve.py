"""``tandem router`` and ``tandem worker``: the two long-running processes."""

from __future__ import annotations

import sys

import click

from tandem.broker.policies import DEFAULT_POLICY
from tandem.cli.options import sim_profile
from tandem.common.settings import DEFAULT_CLIENT_ADDR, DEFAULT_WORKER_ADDR, Addresses
from tandem.workers.backends import BACKENDS


@click.command()
@click.option(
    "--client-addr", envvar="TANDEM_CLIENT_ADDR", default=DEFAULT_CLIENT_ADDR, show_default=True
)
@click.option(
    "--worker-addr", envvar="TANDEM_WORKER_ADDR", default=DEFAULT_WORKER_ADDR, show_default=True
)
@click.option(
    "--policy",
    envvar="TANDEM_POLICY",
    default=DEFAULT_POLICY,
    show_default=True,
    help="finish_time | phase_cost | least_tokens | cache_aware | least_loaded | round_robin "
    "| forced:SEL",
)
@click.option(
    "--liveness-s",
    type=float,
    default=3.0,
    show_default=True,
    help="Minimum silence before a worker is expired.",
)
@click.option(
    "--no-worker-wait-s",
    type=float,
    default=30.0,
    show_default=True,
    help="How long a request waits for a first worker.",
)
@click.option(
    "--decision-log",
    type=click.Path(dir_okay=False),
    default=None,
    help="Append one JSON line per routing decision to this file.",
)
@click.option(
    "--calibrate/--no-calibrate",
    default=True,
    show_default=True,
    help="Let worker rates follow what requests take (off: price by advertised rates only).",
)
@click.option(
    "--decode-estimate",
    type=click.Choice(["budget", "ratio"]),
    default="budget",
    show_default=True,
    help="Price decode by max_tokens, or scaled by the realized/requested token ratio.",
)
def router(
    client_addr: str,
    worker_addr: str,
    policy: str,
    liveness_s: float,
    no_worker_wait_s: float,
    decision_log: str | None,
    calibrate: bool,
    decode_estimate: str,
) -> None:
    """Run the router."""
    from tandem.broker.main import run_router
    from tandem.broker.router import RouterConfig

    try:
        cfg = RouterConfig(
            Addresses(client_addr, worker_addr),
            policy,
            liveness_s,
            no_worker_wait_s,
            decision_log,
            calibrate,
            decode_estimate,
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    sys.exit(run_router(cfg))


@click.command()
@click.option(
    "--router",
    "router_addr",
    envvar="TANDEM_WORKER_ADDR",
    default=DEFAULT_WORKER_ADDR,
    show_default=True,
    help="The router's worker address.",
)
@click.option(
    "--backend",
    type=click.Choice(BACKENDS),
    default="llama.cpp",
    show_default=True,
)
@click.option(
    "--model",
    type=click.Path(exists=True),
    default=None,
    help="A GGUF file (or an MLX model folder); default: the embedded SmolLM2-135M.",
)
@click.option("--worker-id", default=None, help="Default: DEVICE-HOST-PID.")
@click.option(
    "--device", default="auto", show_default=True, help="auto | cpu | gpu (mlx); a label."
)
@click.option("--threads", type=int, default=2, show_default=True)
@click.option("--max-active", type=int, default=4, show_default=True)
@click.option("--n-ctx", type=int, default=8192, show_default=True, help="KV cells, all sequences.")
@click.option(
    "--step-tokens",
    type=int,
    default=256,
    show_default=True,
    help="Token budget of one batch step (decode first, then prefill chunks).",
)
@click.option("--block-size", type=int, default=16, show_default=True)
@click.option(
    "--cache-tokens",
    type=int,
    default=4096,
    show_default=True,
    help="KV tokens the prefix cache may keep after requests end.",
)
@click.option("--cache-entries", type=int, default=16, show_default=True)
@click.option("--heartbeat-s", type=float, default=0.5, show_default=True)
@click.option("--prefill-tok-s", type=float, default=None, help="Override the profiled rate.")
@click.option("--decode-tok-s", default=None, help="Comma list: aggregate tok/s at batch 1,2,..")
@click.option(
    "--warmup",
    type=click.Choice(["auto", "on", "off"]),
    default="auto",
    show_default=True,
    help="Run every batch shape once before registering (auto: on GPU devices).",
)
@sim_profile
def worker(
    router_addr: str,
    backend: str,
    model: str | None,
    worker_id: str | None,
    device: str,
    threads: int,
    max_active: int,
    n_ctx: int,
    step_tokens: int,
    block_size: int,
    cache_tokens: int,
    cache_entries: int,
    heartbeat_s: float,
    prefill_tok_s: float | None,
    decode_tok_s: str | None,
    warmup: str,
    profile_file: str | None,
) -> None:
    """Run a worker process (one device)."""
    from tandem.workers.config import WorkerConfig
    from tandem.workers.engine import EngineConfig
    from tandem.workers.main import run_worker

    try:
        engine = EngineConfig(
            max_active, step_tokens, block_size, cache_tokens, cache_entries, heartbeat_s
        )
        decode = tuple(float(x) for x in decode_tok_s.split(",")) if decode_tok_s else None
        cfg = WorkerConfig(
            router_addr,
            backend,
            model,
            worker_id,
            device,
            threads,
            n_ctx,
            engine,
            prefill_tok_s,
            decode,
            profile_file,
            warmup,
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    try:
        code = run_worker(cfg)
    except (ValueError, FileNotFoundError) as exc:  # e.g. --device gpu without a GPU
        click.echo(f"tandem worker: {exc}", err=True)
        code = 2
    sys.exit(code)
