"""``tandem route explain`` and ``tandem decisions``: routing decisions, offline.

As in the rest of the CLI, tables go to stderr and ``--json`` prints one JSON
document on stdout.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import click

from tandem.broker.policies import DEFAULT_POLICY
from tandem.cli.tables import render


# ------------------------------------------------------------ route explain
@click.group()
def route() -> None:
    """Inspect routing decisions without running any process."""


@route.command()
@click.argument("state_file", type=click.File("r"))
@click.option(
    "--policy",
    default=DEFAULT_POLICY,
    show_default=True,
    help="finish_time | phase_cost | least_tokens | cache_aware | least_loaded | round_robin "
    "| forced:SEL",
)
@click.option("--json", "as_json", is_flag=True, help='Print {"choice": ID, "scores": {...}}.')
def explain(state_file: Any, policy: str, as_json: bool) -> None:
    """Score the request and workers of STATE_FILE (JSON) as the router would.

    STATE_FILE: {"request": {"prompt_tokens", "max_tokens", "needs"?: [capability]},
    "workers": [{"id", "prefill_rate", "decode_rate" (tok/s, or a list by batch size),
    "cached_tokens", "capabilities"?: [...], "active": [{"prefill_remaining",
    "decode_remaining"}], "queued": [...], "served"?: {...}}]}. A worker without a
    capability the request needs is excluded before scoring, as the router does. A
    worker's "served" (as `tandem status --json` rows carry it) says why its rates
    were repriced below its claims, when they were.
    """
    from tandem.broker.policies import NoCandidate, parse_policy
    from tandem.broker.policies.cost import phase_terms
    from tandem.broker.policies.state import state_from_json

    try:
        state = json.load(state_file)
        req, views = state_from_json(state)
        excluded = _excluded(state)
        views = [v for v in views if v.id not in excluded]
        chooser = parse_policy(policy)
        if not views:
            raise ValueError(f"no worker has what the request needs: {excluded}")
        decision = chooser.choose(req, views)  # the router's live path calls the same
    except (json.JSONDecodeError, ValueError, NoCandidate) as exc:
        raise click.UsageError(f"{state_file.name}: {exc}") from None
    repriced = _repriced(state)
    if as_json:
        out: dict[str, Any] = {"choice": decision.worker_id, "scores": decision.scores}
        out |= {"excluded": excluded} if excluded else {}
        click.echo(json.dumps(out | ({"repriced": repriced} if repriced else {})))
        return
    rows = []
    for v in views:
        t = phase_terms(req, v)
        mark = "*" if v.id == decision.worker_id else ""
        rows.append(
            [mark + v.id, len(v.active), len(v.queued), v.cached_tokens, t.prefill_tokens]
            + [t.decode_tokens, t.prefill_rate, t.decode_rate]
            + [t.prefill_tokens / t.prefill_rate, t.decode_tokens / t.decode_rate]
            + [_score(decision.scores.get(v.id, "-"), v.id in decision.pruned)]
        )
    headers = ["worker", "active", "queued", "cached", "P", "D", "prefill/s", "decode/s"]
    headers += ["P/rate s", "D/rate s", "score"]
    head = (
        f"request: {req.prompt_tokens} prompt tokens, max_tokens {req.max_tokens}; "
        f"policy {chooser.name}; choice {decision.worker_id} (*)"
    )
    why = [f"excluded {wid}: {reason}" for wid, reason in excluded.items()]
    why += [f"repriced {wid}: {reason}" for wid, reason in repriced.items()]
    click.echo("\n".join([head, render(headers, rows), *why]), err=True)


def _repriced(state: dict[str, Any]) -> dict[str, str]:
    """Why workers of a STATE document are priced below their claims (their status
    rows' ``served.repriced``: broker/observed.py), by id."""
    out = {}
    for w in state["workers"]:
        served = w.get("served")
        if isinstance(served, dict) and served.get("repriced"):
            out[str(w["id"])] = str(served["repriced"])
    return out


def _excluded(state: dict[str, Any]) -> dict[str, str]:
    """The workers of a STATE document that lack a capability its request needs."""
    from tandem.broker.capabilities import exclusions

    needs = state["request"].get("needs") or []
    if not isinstance(needs, list):
        raise ValueError("request.needs must be a list of capabilities")
    caps = {str(w["id"]): w.get("capabilities") or [] for w in state["workers"]}
    return exclusions(caps, needs) if needs else {}


# ------------------------------------------------------------ decisions
@click.command()
@click.argument("log_file", type=click.Path(exists=True, dir_okay=False))
@click.option("--request", "request_id", default=None, help="Only this request's decisions.")
@click.option("--tail", type=int, default=None, help="Only the last N decisions.")
def decisions(log_file: str, request_id: str | None, tail: int | None) -> None:
    """Print a router's decision log (--decision-log) as a table, one row per candidate."""
    from tandem.broker.decisions import read_decisions

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
                + [_score(c.get("score"), bool(c.get("pruned")))]
            )
            lead = ["", "", "", ""]  # the decision's own columns only on its first row
        for wid, reason in (r.get("excluded") or {}).items():  # lacked what it needs
            rows.append(lead + [wid, "", "", "", "", "", "", "", f"excluded: {reason}"])
            lead = ["", "", "", ""]
    headers = ["time_s", "request", "policy", "prompt/max", "worker", "act", "que", "cached"]
    headers += ["P", "D", "prefill/s", "decode/s", "score"]
    return f"{len(records)} decision(s) from {first}; * = choice\n" + render(headers, rows)


def _score(score: Any, pruned: bool) -> Any:
    """A score as shown; a pruned candidate's is the lower bound that ruled it out."""
    if score is None:
        return "-"
    return f">={score:.6g}" if pruned else score
