"""``tandem generate`` and ``tandem status``: the router's clients on the command line."""

from __future__ import annotations

import json
import re
import sys
from typing import Any

import click

from tandem.cli.options import client_addr, keys_option, ray_option, via_ray
from tandem.client.waiting import waiting_for_starting
from tandem.common import protocol as p


@click.command()
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
@keys_option
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
    keys: str | None,
) -> None:
    """Generate a completion for PROMPT."""
    from tandem.client import Client, TandemError

    # Keyword arguments of Client.stream, whose own checks type them (client/checks.py).
    text_arg: dict[str, Any] = (
        {"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt}
    )
    options: dict[str, Any] = dict(
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        seed=seed,
        stop=list(stop),
        ignore_eos=ignore_eos,
        worker=worker_sel,
    )
    _check_arguments(text_arg, options, timeout_s)
    shown = False  # streamed text is on the screen, its line not ended yet
    try:
        explain = _explainer(worker_sel)
        with Client(router_addr, timeout_s=timeout_s, keys=keys, on_wait=explain) as c:
            s = c.stream(**text_arg, **options)
            for delta in s:
                if stream and not as_json:
                    click.echo(delta.text, nl=False)
                    shown = shown or bool(delta.text)
            result = s.result
    except TandemError as exc:
        if shown:  # end the streamed line: the error gets its own
            click.echo()
        click.echo(f"error ({exc.code}): {exc.message}", err=True)
        sys.exit(1)
    except ValueError as exc:  # e.g. an unreadable keys folder
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
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


def _check_arguments(text_arg: dict[str, Any], options: dict[str, Any], timeout_s: float) -> None:
    """One clear line and exit 1 for any argument the request cannot carry."""
    from tandem.client.errors import BadRequest
    from tandem.client.session import make_submit

    problem = None
    if not 0 < timeout_s < 1e9:
        problem = "--timeout-s must be a positive number of seconds"
    try:
        make_submit(**text_arg, **options)  # checked as the router's door checks it
    except BadRequest as exc:  # what the router would refuse (client/checks.py)
        problem = problem or exc.message
    except UnicodeError:  # undecodable bytes in the command line
        problem = problem or "the arguments must be valid UTF-8 text"
    except (OverflowError, ValueError, TypeError) as exc:  # ints past 64 bits, ...
        problem = problem or f"an argument is out of range: {exc}"
    if problem:  # the same line and exit code as the router's bad_request
        click.echo(f"error (bad_request): {problem}", err=True)
        sys.exit(1)


@click.command()
@client_addr
@click.option("--json", "as_json", is_flag=True)
@keys_option
@ray_option
def status(router_addr: str, as_json: bool, keys: str | None, ray_address: str | None) -> None:
    """Show the router's workers and their load."""
    from tandem.client import Client, TandemError

    router_addr, keys = via_ray(ray_address, router_addr, keys)

    try:
        with Client(router_addr, connect_timeout_s=3.0, retries=1, keys=keys) as c:
            reply = c.status()
    except TandemError as exc:
        click.echo(f"error ({exc.code}): {exc.message}", err=True)
        sys.exit(1)
    except ValueError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
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
    from tandem.cli.tables import workers_table

    click.echo(workers_table(reply))


def _fmt_s(v: object) -> str:
    return f"{v:.3f}s" if isinstance(v, int | float) else "-"


def _explainer(worker_sel: str | None) -> Any:
    """``on_wait`` for the Client: a line on stderr saying what the request waits for,
    again whenever that changes (the client asks every few seconds while it waits);
    a line whose numbers alone changed (seconds left) is not repeated."""
    said = [""]

    def explain(status: p.StatusReply) -> None:
        line = waiting_line(status, worker_sel)
        shape = re.sub(r"[0-9.]+", "#", line)
        if line and shape != said[0]:
            said[0] = shape
            click.echo(line, err=True)

    return explain


def waiting_line(status: p.StatusReply, worker_sel: str | None = None) -> str:
    """Why a request the router holds is not running yet, from its status ("" when
    none waits there any more: it was placed after the client asked)."""
    workers = status.workers
    if worker_sel and not any(worker_sel in (w["id"], w["device"]) for w in workers):
        named = [s for s in status.starting if worker_sel in (s["id"], s["device"])]
        if named:
            return waiting_for_starting(named)
        return f"waiting for worker {worker_sel} to register (the router holds the request)"
    if not workers and status.starting:  # who is coming, doing what, ready in how long
        return waiting_for_starting(status.starting)
    if not workers:
        return (
            "waiting for a worker to register: none has yet (a starting worker registers "
            "once its model is loaded and measured; the router holds the request until "
            "its --no-worker-wait-s runs out)"
        )
    full = [w for w in workers if w["active"] >= w["max_active"]]
    if len(full) == len(workers):
        busy = ", ".join(f"{w['id']} {w['active']}/{w['max_active']}" for w in full)
        return (
            f"waiting for a free slot: every worker is full ({busy}); "
            f"{status.requests_pending} request(s) waiting in all"
        )
    if not status.requests_pending:  # placed meanwhile: its first output is on its way
        return ""
    return f"waiting at the router: {status.requests_pending} request(s) not yet placed"
