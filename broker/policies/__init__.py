"""Routing policies: views of workers (``views``), one module per family
(``simple``: no device model; ``cost``: token and time pricing; ``finish``: the
worker's schedule replayed forward), and the registry
that builds a policy from its name."""

from __future__ import annotations

from tandem.broker.policies.cost import CacheAware, LeastTokens, PhaseCost
from tandem.broker.policies.finish import FinishTime
from tandem.broker.policies.lookahead import Lookahead
from tandem.broker.policies.simple import Forced, LeastLoaded, RoundRobin
from tandem.broker.policies.views import (
    Decision,
    Load,
    NoCandidate,
    Policy,
    RouteRequest,
    WorkerView,
    tie_break,
)

# The router's default: finish_time's prediction, plus a rollout of the arrivals a
# burst promises on batch-hungry workers (docs/ROUTING.md: the twin's robustness
# suite, and the H200's 8-bursts).
DEFAULT_POLICY = "lookahead"

POLICIES: dict[str, type] = {
    p.name: p
    for p in (PhaseCost, FinishTime, Lookahead, LeastTokens, CacheAware, LeastLoaded, RoundRobin)
}


def parse_policy(spec: str) -> Policy:
    """A policy by name (see POLICIES), or ``forced:<worker id or device label>``."""
    if spec.startswith("forced:"):
        return Forced(spec.split(":", 1)[1])
    if spec not in POLICIES:
        raise ValueError(f"unknown policy {spec!r}; choose from {sorted(POLICIES)} or forced:<sel>")
    policy: Policy = POLICIES[spec]()
    return policy


__all__ = [
    "DEFAULT_POLICY",
    "POLICIES",
    "CacheAware",
    "LeastTokens",
    "PhaseCost",
    "Decision",
    "FinishTime",
    "Forced",
    "LeastLoaded",
    "Lookahead",
    "RoundRobin",
    "Load",
    "NoCandidate",
    "Policy",
    "RouteRequest",
    "WorkerView",
    "parse_policy",
    "tie_break",
]
