"""``tandem router`` and ``tandem worker``: the two long-running processes."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import click

from tandem.broker.admission import AdmissionConfig
from tandem.broker.calibration import DECODE_ESTIMATES
from tandem.broker.config import RouterConfig
from tandem.cli.options import (
    config_default,
    cpus_option,
    field_option,
    keys_option,
    node_option,
    sim_profile,
)
from tandem.common.settings import DEFAULT_CLIENT_ADDR, DEFAULT_WORKER_ADDR, Addresses
from tandem.workers.backends import BACKENDS
from tandem.workers.config import WARMUP, WEIGHTS, EngineConfig, WorkerConfig
from tandem.workers.memory import parse_bytes
from tandem.workers.prefix_cache import POLICIES

R, E, W, A = RouterConfig, EngineConfig, WorkerConfig, AdmissionConfig


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
    default=config_default(R, "policy"),
    show_default=True,
    help="finish_time | phase_cost | least_tokens | cache_aware | least_loaded | round_robin "
    "| forced:SEL",
)
@field_option(R, "liveness_s", "Minimum silence before a worker is expired.")
@field_option(R, "no_worker_wait_s", "How long a request waits for a first worker.")
@click.option(
    "--decision-log",
    type=click.Path(dir_okay=False),
    default=None,
    help="Append one JSON line per routing decision to this file.",
)
@click.option(
    "--calibrate/--no-calibrate",
    default=config_default(R, "calibrate"),
    show_default=True,
    help="Price workers by their live step times (off: by their repaired profiles only).",
)
@click.option(
    "--decode-estimate",
    type=click.Choice(DECODE_ESTIMATES),
    default=config_default(R, "decode_estimate"),
    show_default=True,
    help="Price decode by max_tokens, or scaled by the realized/requested token ratio.",
)
@cpus_option
@click.option(
    "--metrics-port",
    type=int,
    envvar="TANDEM_METRICS_PORT",
    default=config_default(R, "metrics_port"),
    help="Serve Prometheus /metrics on this port (off when unset).",
)
@click.option(
    "--metrics-host",
    envvar="TANDEM_METRICS_HOST",
    default=config_default(R, "metrics_host"),
    show_default=True,
    help="Address the metrics endpoint binds.",
)
@field_option(A, "max_pending", "Requests waiting for a worker; past this: `overloaded`.")
@field_option(A, "queue_per_slot", "Queued requests a worker may hold per batch slot.")
@field_option(A, "max_prompt_chars")
@field_option(R, "no_progress_s", "Expire a worker holding requests with no progress this long.")
@field_option(R, "accept_hold_ms", "Hold a request's Accepted this long for its first output.")
@field_option(R, "spin_us", "Poll at most this long before sleeping, adapted to traffic; 0: off.")
@field_option(R, "max_connections_per_address", "Connections one peer address may hold per socket.")
@keys_option
def router(
    client_addr: str,
    worker_addr: str,
    policy: str,
    liveness_s: float,
    no_worker_wait_s: float,
    decision_log: str | None,
    calibrate: bool,
    decode_estimate: str,
    cpus: tuple[int, ...] | None,
    metrics_port: int | None,
    metrics_host: str,
    max_pending: int,
    queue_per_slot: int,
    max_prompt_chars: int,
    no_progress_s: float,
    accept_hold_ms: float,
    spin_us: float,
    max_connections_per_address: int,
    keys: str | None,
) -> None:
    """Run the router."""
    from tandem.broker.admission import AdmissionConfig
    from tandem.broker.main import run_router
    from tandem.common.auth import keys_dir

    try:
        cfg = RouterConfig(
            policy=policy,
            liveness_s=liveness_s,
            no_worker_wait_s=no_worker_wait_s,
            decision_log=decision_log,
            calibrate=calibrate,
            decode_estimate=decode_estimate,
            cpus=cpus,
            metrics_port=metrics_port,
            metrics_host=metrics_host,
            admission=AdmissionConfig(
                max_pending=max_pending,
                queue_per_slot=queue_per_slot,
                max_prompt_chars=max_prompt_chars,
            ),
            no_progress_s=no_progress_s,
            accept_hold_ms=accept_hold_ms,
            spin_us=spin_us,
            max_connections_per_address=max_connections_per_address,
            keys=str(keys_dir(keys)) if keys else None,
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    sys.exit(run_router(cfg, Addresses(client_addr, worker_addr)))


def cache_memory_options(f: Any) -> Any:
    """The prefix cache's memory flags (workers/memory.py says what each default is)."""
    frac = click.FloatRange(0, 1)
    for name, kind, text in (
        ("--cache-policy", click.Choice(POLICIES), "Eviction: value (what is shared or long "
         "stays longer) or lru."),
        ("--host-cache-mem", str, "The host-RAM tier's size (e.g. 4GiB) [default: a share of "
         "host RAM, llama.cpp only]."),
        ("--host-cache-mem-frac", frac, "The host-RAM tier's share of available host RAM."),
        ("--cache-mem", str, "The device tier's size (e.g. 2GiB; K/M/G are powers of 1024)."),
        ("--cache-mem-frac", frac, "The device tier's share of the device's available "
         "memory (GPU: free memory; CPU: host RAM; Metal: the recommended working set)."),
    ):  # fmt: skip
        default = "value" if name == "--cache-policy" else None
        f = click.option(name, type=kind, default=default, show_default=default is not None,
                         help=text)(f)  # fmt: skip
    return f


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
    "--router-file",
    type=click.Path(dir_okay=False),
    default=None,
    help="Read the router's worker address from this file, and follow it when the file "
    "changes (a router that moved; tandem serve --ray writes it). Overrides --router.",
)
@click.option(
    "--backend",
    type=click.Choice(BACKENDS),
    default=config_default(W, "backend"),
    show_default=True,
)
@click.option(
    "--model",
    default=None,
    help="A GGUF file, an MLX model folder, or a Hugging Face name (ORG/NAME-GGUF:Q4_K_M, "
    "ORG/NAME/file.gguf); default: the embedded SmolLM2-135M.",
)
@click.option("--worker-id", default=None, help="Default: DEVICE-HOST-PID.")
@click.option(
    "--device",
    default=config_default(W, "device"),
    show_default=True,
    help="auto | cpu | gpu (mlx); a label.",
)
@field_option(W, "threads", "llama.cpp threads; 0: the cores this worker may use less one "
              "(all of --cpus when given), at least 1.")  # fmt: skip
@field_option(E, "max_active", "Requests this worker runs at once (the rows of its batch).")
@field_option(W, "n_ctx", "KV cells, all sequences.")
@field_option(E, "step_tokens", "Token budget of one batch step (decode first, then prefill).")
@field_option(E, "step_budget_x", "While requests decode, a step with prompt chunks "
              "lasts about this many decode steps (live step model); 0: tokens only.")  # fmt: skip
@field_option(E, "block_size")
@field_option(E, "cache_tokens", "KV tokens the prefix cache keeps on the device after "
              "requests end [default: sized from the device's memory].", type=int)  # fmt: skip
@field_option(E, "cache_entries", "Entries on the device [default: what the backend holds].",
              type=int)  # fmt: skip
@cache_memory_options
@field_option(E, "heartbeat_s")
@click.option("--prefill-tok-s", type=float, default=None, help="Override the profiled rate.")
@click.option("--decode-tok-s", default=None, help="Comma list: aggregate tok/s at batch 1,2,..")
@click.option(
    "--warmup",
    type=click.Choice(WARMUP),
    default=config_default(W, "warmup"),
    show_default=True,
    help="What to measure before registering: on = every batch shape (a GPU also compiles "
    "its kernels then), quick = a few steps in seconds, off = nothing; auto = on for a GPU, "
    "nothing for a simulated device or one the rate flags or a stored profile price, else "
    "quick. Rates not yet borne out by served steps are marked provisional.",
)
@click.option(
    "--weights",
    type=click.Choice(WEIGHTS),
    default=config_default(W, "weights"),
    show_default=True,
    help="A CPU llama.cpp worker's weights: q8_0 = the model converted once to Q8_0 (all "
    "but lossless from a 4-6 bit file; batched CPU kernels), as-is = the file as given, "
    "auto = Q8_0 where its first start measures it faster and scoring alike.",
)
@click.option(
    "--progress-json",
    is_flag=True,
    help="Print one JSON object per line to stdout as the worker starts: loading, "
    "measuring (done/total), registered (provisional), error.",
)
@node_option
@click.option(
    "--keep-profile",
    is_flag=True,
    help="Store what this worker measures at its start as its profile when none is "
    "stored, so that its next start registers at once (tandem serve's workers do).",
)
@sim_profile
@cpus_option
@keys_option
def worker(
    router_addr: str,
    router_file: str | None,
    backend: str,
    model: str | None,
    worker_id: str | None,
    device: str,
    threads: int,
    max_active: int,
    n_ctx: int,
    step_tokens: int,
    step_budget_x: float,
    block_size: int,
    cache_tokens: int | None,
    cache_entries: int | None,
    cache_mem_frac: float | None,
    cache_mem: str | None,
    host_cache_mem_frac: float | None,
    host_cache_mem: str | None,
    cache_policy: str,
    heartbeat_s: float,
    prefill_tok_s: float | None,
    decode_tok_s: str | None,
    warmup: str,
    weights: str,
    progress_json: bool,
    keep_profile: bool,
    profile_file: str | None,
    cpus: tuple[int, ...] | None,
    keys: str | None,
    node: str,
) -> None:
    """Run a worker process (one device)."""
    from tandem.workers.follow import read_address
    from tandem.workers.main import run_worker

    try:
        router_addr = read_address(router_file) if router_file else router_addr
        engine = EngineConfig(
            max_active=max_active,
            step_tokens=step_tokens,
            step_budget_x=step_budget_x,
            block_size=block_size,
            cache_tokens=cache_tokens,
            cache_entries=cache_entries,
            cache_policy=cache_policy,
            heartbeat_s=heartbeat_s,
        )
        decode = tuple(float(x) for x in decode_tok_s.split(",")) if decode_tok_s else None
        cfg = WorkerConfig(
            router=router_addr,
            router_file=router_file,
            backend=backend,
            model=model,
            worker_id=worker_id,
            device=device,
            threads=threads,
            n_ctx=n_ctx,
            engine=engine,
            prefill_tok_s=prefill_tok_s,
            decode_tok_s=decode,
            profile=profile_file,
            warmup=warmup,
            weights=weights,
            progress_json=progress_json,
            keep_profile=keep_profile,
            cpus=cpus,
            keys=keys,
            cache_mem_frac=cache_mem_frac,
            cache_mem=parse_bytes(cache_mem) if cache_mem else None,
            host_cache_mem_frac=host_cache_mem_frac,
            host_cache_mem=parse_bytes(host_cache_mem) if host_cache_mem else None,
            node=node,
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    try:
        code = run_worker(cfg)
    except (ValueError, FileNotFoundError) as exc:  # e.g. --device gpu without a GPU
        click.echo(f"tandem worker: {exc}", err=True)
        code = 2
    # Exit without interpreter teardown: native libraries (llama.cpp, MLX/CUDA) can
    # take seconds to free a model, and nothing of the worker's needs it.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
