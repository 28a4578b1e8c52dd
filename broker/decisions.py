"""The decision log: one JSON line per routing decision, with every candidate's terms."""

from __future__ import annotations

import json
import time
from typing import IO, Any

from broker.policy import Decision, RouteRequest, WorkerView
from broker.scoring import phase_terms


def decision_record(
    request_id: str, policy: str, req: RouteRequest, views: list[WorkerView], decision: Decision
) -> dict[str, Any]:
    candidates = []
    for v in views:
        t = phase_terms(req, v)
        candidates.append(
            {
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
        )
    return {
        "time": time.time(),
        "request": request_id,
        "prompt_tokens": req.prompt_tokens,
        "max_tokens": req.max_tokens,
        "policy": policy,
        "candidates": candidates,
        "choice": decision.worker_id,
    }


class DecisionLog:
    def __init__(self, path: str) -> None:
        self._f: IO[str] = open(path, "a", buffering=1)  # noqa: SIM115 - lives with the router

    def write(
        self,
        request_id: str,
        policy: str,
        req: RouteRequest,
        views: list[WorkerView],
        decision: Decision,
    ) -> None:
        self._f.write(json.dumps(decision_record(request_id, policy, req, views, decision)) + "\n")

    def close(self) -> None:
        self._f.close()
