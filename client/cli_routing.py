"""Routing commands of the ``tandem`` CLI: ``route explain``, ``decisions``, ``profile``.

They attach to the group ``client.cli.main`` when this module is imported
(client/cli.py imports it last). As in the rest of the CLI, tables go to stderr
and ``--json`` prints one JSON document on stdout.
"""

from __future__ import annotations

import json
import os
from datetime import datetime
from typing import Any

import click

from client.cli import main, sim_profile
from client.tables import render


# ------------------------------------------------------------ route explain
@main.group()
def route() -> None:
    """Inspect routing decisions without running any process."""


@route.command()
@click.argument("state_file", type=click.File("r"))
@click.option(
    "--policy",
    default="phase_cost",
    show_default=True,
    help="phase_cost | least_tokens | cache_aware | least_loaded | round_robin | forced:SEL",
)
@click.option("--json", "as_json", is_flag=True, help='Print {"choice": ID, "scores": {...}}.')
def explain(state_file: Any, policy: str, as_json: bool) -> None:
    """Score the request and workers of STATE_FILE (JSON) as the router would.

    STATE_FILE: {"request": {"prompt_tokens", "max_tokens"}, "workers": [{"id",
    "prefill_rate", "decode_rate" (tok/s, or a list by batch size), "cached_tokens",
    "active": [{"prefill_remaining", "decode_remaining"}], "queued": [...]}]}.
    """
    from broker.policy import NoCandidate, parse_policy
    from broker.scoring import phase_terms, state_from_json

    try:
        state = json.load(state_file)
        req, views = state_from_json(state)
        chooser = parse_policy(policy)
        decision = chooser.choose(req, views)  # the router's live path calls the same
    except (json.JSONDecodeError, ValueError, NoCandidate) as exc:
        raise click.UsageError(f"{state_file.name}: {exc}") from None
    if as_json:
        click.echo(json.dumps({"choice": decision.worker_id, "scores": decision.scores}))
        return
    rows = []
    for v in views:
        t = phase_terms(req, v)
        mark = "*" if v.id == decision.worker_id else ""
        rows.append(
            [mark + v.id, len(v.active), len(v.queued), v.cached_tokens, t.prefill_tokens]
            + [t.decode_tokens, t.prefill_rate, t.decode_rate]
            + [t.prefill_tokens / t.prefill_rate, t.decode_tokens / t.decode_rate]
            + [decision.scores.get(v.id, "-")]
        )
    headers = ["worker", "active", "queued", "cached", "P", "D", "prefill/s", "decode/s"]
    headers += ["P/rate s", "D/rate s", "score"]
    head = (
        f"request: {req.prompt_tokens} prompt tokens, max_tokens {req.max_tokens}; "
        f"policy {chooser.name}; choice {decision.worker_id} (*)"
    )
    click.echo(head + "\n" + render(headers, rows), err=True)


# ------------------------------------------------------------ decisions
@main.command()
@click.argument("log_file", type=click.Path(exists=True, dir_okay=False))
@click.option("--request", "request_id", default=None, help="Only this request's decisions.")
@click.option("--tail", type=int, default=None, help="Only the last N decisions.")
def decisions(log_file: str, request_id: str | None, tail: int | None) -> None:
    """Print a router's decision log (--decision-log) as a table, one row per candidate."""
    from broker.decisions import read_decisions

    records = [r for r in read_decisions(log_file) if request_id in (None, r.get("request"))]
    if tail is not None:
        records = records[-tail:] if tail > 0 else []
    if not records:
        click.echo("(no decisions)", err=True)
        return
    click.echo(decisions_table(records), err=True)


def decisions_table(records: list[dict[str, Any]]) -> str:
    """One row per candidate; the chosen one is marked ``*``; time is relative to the first."""
    t0 = float(records[0].get("time", 0.0))
    first = datetime.fromtimestamp(t0).isoformat(sep=" ", timespec="milliseconds")
    rows = []
    for r in records:
        lead = [
            f"+{float(r.get('time', t0)) - t0:.3f}",
            r.get("request", "?"),
            r.get("policy", "?"),
            f"{r.get('prompt_tokens', '?')}/{r.get('max_tokens', '?')}",
        ]
        for c in r["candidates"]:
            mark = "*" if c.get("id") == r.get("choice") else ""
            rows.append(
                lead
                + [
                    mark + str(c.get("id")),
                    c.get("active"),
                    c.get("queued"),
                    c.get("cached_tokens"),
                ]
                + [c.get("P"), c.get("D"), c.get("prefill_rate"), c.get("decode_rate")]
                + ["-" if c.get("score") is None else c.get("score")]
            )
            lead = ["", "", "", ""]  # the decision's own columns only on its first row
    headers = ["time_s", "request", "policy", "prompt/max", "worker", "act", "que", "cached"]
    headers += ["P", "D", "prefill/s", "decode/s", "score"]
    return f"{len(records)} decision(s) from {first}; * = choice\n" + render(headers, rows)


# ------------------------------------------------------------ profile
@main.command()
@click.option("--backend", type=click.Choice(["llama.cpp", "mlx", "sim"]), default="llama.cpp")
@click.option("--model", type=click.Path(exists=True), default=None, help="Default: embedded.")
@click.option("--device", default="auto", show_default=True)
@click.option("--threads", type=int, default=2, show_default=True)
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
@click.option("--repeats", type=int, default=3, show_default=True)
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
    save: bool,
    as_json: bool,
) -> None:
    """Measure a worker's backend in isolation (no router) and store its rates."""
    from workers.engine import EngineConfig
    from workers.main import WorkerConfig, build_backend
    from workers.profiler import kv_cells_needed, profile_backend
    from workers.profiles import save_profile

    need = kv_cells_needed(max_active, prompt_tokens, decode_tokens, decode_context)
    try:
        engine = EngineConfig(max_active=max_active, step_tokens=step_tokens)
        cfg = WorkerConfig(
            "inproc://unused",
            backend,
            model,
            None,
            device,
            threads,
            n_ctx or max(4096, need),
            engine,
            profile=profile_file,
        )
        be = build_backend(cfg)
        click.echo(f"profiling {be.name} on {be.device} ({be.model_name})...", err=True)
        _warn_if_busy(threads if backend == "llama.cpp" else 1)
        result = profile_backend(
            be, max_active, prompt_tokens, decode_tokens, repeats, step_tokens, 0, decode_context
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    doc = result.to_json()
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
    rows = [[b, x, x / b, 1000 * b / x] for b, x in enumerate(doc["decode_tok_s"], 1)]
    lines.append(f"decode after {doc.get('decode_context', '?')}-token prompts:")
    lines.append(render(["batch", "decode tok/s", "per request", "step ms"], rows))
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
