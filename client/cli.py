"""The ``tandem`` command line. Progress and tables go to stderr; --json to stdout."""

from __future__ import annotations

import json
import logging
import sys

import click

from common.settings import DEFAULT_CLIENT_ADDR, DEFAULT_WORKER_ADDR, Addresses, env_str


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname).1s %(name)s: %(message)s",
    )


@click.group()
@click.option("--log-level", default=lambda: env_str("LOG_LEVEL", "info"), show_default="info")
def main(log_level: str) -> None:
    """tandem: one model served from CPU and GPU workers behind one router."""
    _setup_logging(log_level)


client_addr = click.option(
    "--router",
    "router_addr",
    envvar="TANDEM_CLIENT_ADDR",
    default=DEFAULT_CLIENT_ADDR,
    show_default=True,
    help="The router's client address.",
)

# Shared by `tandem worker` and `tandem profile`.
sim_profile = click.option(
    "--profile",
    "profile_file",
    type=click.Path(exists=True),
    default=None,
    help="sim backend: the device profile (JSON).",
)


@main.command()
@click.option(
    "--client-addr", envvar="TANDEM_CLIENT_ADDR", default=DEFAULT_CLIENT_ADDR, show_default=True
)
@click.option(
    "--worker-addr", envvar="TANDEM_WORKER_ADDR", default=DEFAULT_WORKER_ADDR, show_default=True
)
@click.option(
    "--policy",
    envvar="TANDEM_POLICY",
    default="phase_cost",
    show_default=True,
    help="phase_cost | least_tokens | cache_aware | least_loaded | round_robin | forced:SEL",
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
    from broker.main import run_router
    from broker.router import RouterConfig

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


@main.command()
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
    type=click.Choice(["llama.cpp", "mlx", "sim"]),
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
    from workers.engine import EngineConfig
    from workers.main import WorkerConfig, run_worker

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


@main.command()
@click.argument("prompt")
@client_addr
@click.option("--max-tokens", type=int, default=128, show_default=True)
@click.option("--temperature", type=float, default=0.0, show_default=True)
@click.option("--top-p", type=float, default=1.0, show_default=True)
@click.option("--top-k", type=int, default=0, show_default=True)
@click.option("--seed", type=int, default=None)
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
@click.option("--ignore-eos", is_flag=True)
@click.option(
    "--chat/--raw",
    default=True,
    show_default=True,
    help="Wrap the prompt in the model's chat template, or send it as is.",
)
@click.option("--worker", "worker_sel", default=None, help="Pin to a worker id or device label.")
@click.option("--stream", is_flag=True, help="Print tokens as they arrive.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
@click.option("--timeout-s", type=float, default=300.0, show_default=True)
def generate(
    prompt: str,
    router_addr: str,
    max_tokens: int,
    temperature: float,
    top_p: float,
    top_k: int,
    seed: int | None,
    stop: tuple[str, ...],
    ignore_eos: bool,
    chat: bool,
    worker_sel: str | None,
    stream: bool,
    as_json: bool,
    timeout_s: float,
) -> None:
    """Generate a completion for PROMPT."""
    from client import Client, TandemError

    text_arg = {"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt}
    options = dict(
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        seed=seed,
        stop=list(stop),
        ignore_eos=ignore_eos,
        worker=worker_sel,
    )
    try:
        with Client(router_addr, timeout_s=timeout_s) as c:
            s = c.stream(**text_arg, **options)
            for delta in s:
                if stream and not as_json:
                    click.echo(delta.text, nl=False)
            result = s.result
    except TandemError as exc:
        click.echo(f"error ({exc.code}): {exc.message}", err=True)
        sys.exit(1)
    if as_json:
        click.echo(json.dumps(result.to_json()))
        return
    click.echo("" if stream else result.text)
    st = result.stats
    click.echo(
        f"[{result.finish_reason}] worker {result.worker}: {st.get('prompt_tokens')} prompt "
        f"({st.get('cached_tokens')} cached), {st.get('output_tokens')} output tokens, "
        f"TTFT {_fmt_s(st.get('ttft_s'))}, total {_fmt_s(st.get('e2e_s'))}",
        err=True,
    )


@main.command()
@client_addr
@click.option("--json", "as_json", is_flag=True)
def status(router_addr: str, as_json: bool) -> None:
    """Show the router's workers and their load."""
    from client import Client, TandemError

    try:
        with Client(router_addr, connect_timeout_s=3.0, retries=1) as c:
            reply = c.status()
    except TandemError as exc:
        click.echo(f"error ({exc.code}): {exc.message}", err=True)
        sys.exit(1)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "policy": reply.policy,
                    "workers": reply.workers,
                    "requests_in_flight": reply.requests_in_flight,
                    "requests_pending": reply.requests_pending,
                }
            )
        )
        return
    from client.tables import workers_table

    click.echo(workers_table(reply), err=True)


def _fmt_s(v: object) -> str:
    return f"{v:.3f}s" if isinstance(v, int | float) else "-"


# Subcommands defined in their own modules register themselves on `main`.
import client.cli_bench  # noqa: E402, F401, I001  (bench, bench report)
import client.cli_routing  # noqa: E402, F401  (route explain, decisions, profile)
