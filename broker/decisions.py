"""The decision log: one JSON line per routing decision, with every candidate's terms.

A record: ``time`` (unix seconds, stamped as the log writes it), ``request`` (the
client's id), ``prompt_tokens``,
``max_tokens`` (the decode estimate the policy saw), ``policy``, ``candidates``
(per worker: ``id``, ``device``, ``active``, ``queued``, ``cached_tokens`` of this
prompt, phase_cost's ``P`` and ``D`` tokens, ``prefill_rate``, ``decode_rate`` at
the batch it would run, and the policy's ``score``), ``choice``,
``arrivals_before`` (how long before this request the last 8 client requests
arrived, seconds; absent when none did, within 10 s), plus any ``extra`` fields
the router adds (e.g. the decode estimate in use).
P and D are logged whatever the policy, so runs under different policies can be
compared; ``score`` is always the deciding policy's own. A candidate that
finish_time's branch and bound never scored exactly carries ``"pruned": true``
and, as its ``score``, the lower bound that ruled it out (above the choice's
score, so the choice is still the candidate with the least logged score). A
logged router decides by the very code an unlogged one runs: the log shows
what was computed, and the bound says why each was passed over.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from tandem.broker.policies import Decision, RouteRequest, WorkerView
from tandem.broker.policies.cost import phase_terms

log = logging.getLogger(__name__)


def decision_record(
    request_id: str,
    policy: str,
    req: RouteRequest,
    views: list[WorkerView],
    decision: Decision,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON-able record of one decision (see the module docstring)."""
    candidates = []
    pruned = decision.pruned
    for v in views:
        t = phase_terms(req, v)
        candidate: dict[str, Any] = {
            "id": v.id,
            "device": v.device,
            "active": len(v.active),
            "queued": len(v.queued),
            "cached_tokens": v.cached_tokens,
            "P": t.prefill_tokens,
            "D": t.decode_tokens,
            "prefill_rate": t.prefill_rate,
            "decode_rate": t.decode_rate,
            "score": decision.scores.get(v.id),
        }
        if v.id in pruned:
            candidate["pruned"] = True
        candidates.append(candidate)
    record: dict[str, Any] = {
        "request": request_id,
        "prompt_tokens": req.prompt_tokens,
        "max_tokens": req.max_tokens,
        "policy": policy,
        "candidates": candidates,
        "choice": decision.worker_id,
        **(extra or {}),
    }
    if req.arrivals_before:  # what lookahead reads its forecast from
        record["arrivals_before"] = [round(a, 4) for a in req.arrivals_before[:8]]
    return record


class DecisionLog:
    """Appends records to a file, one line each, flushed per line (safe to tail)."""

    def __init__(self, path: str, clock: Callable[[], float]) -> None:
        """``clock``: the writer's calendar time (unix seconds), which stamps records."""
        self._f: IO[str] = open(path, "a", buffering=1)  # noqa: SIM115 - lives with the router
        self.clock = clock

    def write(self, record: dict[str, Any]) -> None:
        """Append one record (built by ``decision_record``), stamped with the time it
        is written at unless it carries one."""
        if "time" not in record:
            record = {"time": self.clock(), **record}
        self._f.write(json.dumps(record) + "\n")

    def close(self) -> None:
        self._f.close()


def read_decisions(path: str | Path) -> Iterator[dict[str, Any]]:
    """The records of a decision log, in order; unreadable lines are skipped with a warning
    (a log being appended to may end in a partial line)."""
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                log.warning("%s:%d: not a JSON line, skipped", path, n)
                continue
            if isinstance(record, dict) and isinstance(record.get("candidates"), list):
                yield record
            else:
                log.warning("%s:%d: not a decision record, skipped", path, n)
