"""Routing's first hard constraint: a request goes only to a worker that can serve it.

A request needs capabilities (``SamplingParams.needs()``: penalties, logit_bias,
min_p, logprobs, json_schema); a worker advertises the ones it serves
(``Ready.capabilities``). The router considers only the workers whose capabilities
cover the request's needs, and the cost model chooses among those. A request that no
registered worker can serve fails at once with BAD_REQUEST naming what is missing:
workers that can may be starting, but the router cannot know that one ever will,
and a request held for ``no_worker_wait_s`` and then refused is worse than a clear
answer now. (A request that finds no worker registered at all still waits for a
first one, whatever it needs.) A request that needs nothing skips all of this.
"""

from __future__ import annotations

from collections.abc import Iterable

from tandem.broker.registry import WorkerState


def capable_ids(workers: Iterable[WorkerState], needs: frozenset[str]) -> set[str]:
    """The ids of the workers that advertise every capability of ``needs``."""
    return {w.id for w in workers if needs.issubset(w.info.capabilities)}


def excluded(workers: Iterable[WorkerState], needs: frozenset[str]) -> dict[str, str]:
    """Why each worker that cannot serve ``needs`` was passed over (the decision log's
    ``excluded``): ``{worker id: "lacks json_schema, logprobs"}``."""
    return exclusions({w.id: w.info.capabilities for w in workers}, needs)


def exclusions(capabilities: dict[str, Iterable[str]], needs: Iterable[str]) -> dict[str, str]:
    """``excluded`` from plain data: each worker id's capabilities (``tandem route
    explain`` reads them from a state file)."""
    out = {}
    for wid, has in capabilities.items():
        missing = sorted(set(needs).difference(has))
        if missing:
            out[wid] = "lacks " + ", ".join(missing)
    return out


def unservable(
    workers: Iterable[WorkerState], needs: frozenset[str], whom: str = "registered worker"
) -> str:
    """The BAD_REQUEST message for a request none of ``workers`` can serve: what it
    needs, what none of them has, and what each lacks."""
    ws = list(workers)
    offered = set().union(*(w.info.capabilities for w in ws))
    nowhere = sorted(needs - offered)
    if nowhere:
        head = f"no {whom} supports {', '.join(nowhere)}"
    else:
        head = f"no {whom} supports all of {', '.join(sorted(needs))} together"
    each = "; ".join(f"{wid} {why}" for wid, why in sorted(excluded(ws, needs).items())[:8])
    return f"{head}, which this request needs ({each})"
