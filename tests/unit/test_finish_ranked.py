"""The fast path (answers kept in order across a burst, broker/policies/ranked.py)
chooses what exhaustive scoring chooses: every worker's finish predicted from
scratch, the least by ``tie_break`` (fewer requests, then id).

Randomized fleets (rates, loads, prefix hits, context slopes, twins that tie) go
through bursts of one question shape in which workers change between decisions
(new loads, a prefix hit, a new worker in a leaving one's place, the chosen one
taking the request), as the router's views change with Assigns and heartbeats.
"""

from __future__ import annotations

from random import Random

from hypothesis import given, settings
from hypothesis import strategies as st

from tandem.broker.policies import FinishTime, Load, RouteRequest, WorkerView, tie_break
from tandem.broker.policies.finish import predict_finish_s
from tests.unit.test_finish_pruning import requests, views

changes = st.lists(st.tuples(st.integers(0, 11), st.integers(0, 4)), min_size=2, max_size=24)


def exhaustive(req: RouteRequest, fleet: list[WorkerView]) -> str:
    scores = {w.id: predict_finish_s(req, w) for w in fleet}
    return tie_break(fleet, scores).worker_id


@settings(max_examples=300, deadline=None)
@given(views(), requests, changes, st.randoms(use_true_random=False))
def test_the_fast_path_chooses_what_exhaustive_scoring_chooses(
    fleet: list[WorkerView], req: RouteRequest, steps: list[tuple[int, int]], rng: Random
) -> None:
    policy = FinishTime()
    policy.RANKED_CHANGED = 1.0  # the kept order whatever share of the fleet changed
    fresh = len(fleet)
    for pos, how in steps:
        i = pos % len(fleet)
        if how == 1:  # new loads on it (a heartbeat, a Done)
            fleet[i] = fleet[i].replace(active=(*fleet[i].active, Load(0, rng.randint(1, 50))))
        elif how == 2:  # the prompt's prefix on it
            fleet[i] = fleet[i].with_cached(rng.choice([0, 16, 256]))
        elif how == 3:  # another worker in its place
            fleet[i] = fleet[i].replace(id=f"n{fresh}")
            fresh += 1
        got = policy.choose(req, fleet)
        assert got.worker_id == exhaustive(req, fleet)
        # The chosen worker takes the request: its view changes, as after an Assign.
        k = next(j for j, w in enumerate(fleet) if w.id == got.worker_id)
        load = Load(max(1, req.prompt_tokens - fleet[k].cached_tokens), req.max_tokens)
        fleet[k] = fleet[k].replace(queued=(*fleet[k].queued, load))


@settings(max_examples=100, deadline=None)
@given(st.integers(2, 300), st.integers(1, 40), requests)
def test_a_fleet_of_idle_twins_goes_round_by_id_and_requests(
    n: int, burst: int, req: RouteRequest
) -> None:
    """Identical idle workers tie on every score: the fast path's order (score,
    requests, id) is tie_break's, decision after decision."""
    fleet = [WorkerView(f"w{i:03d}", 2000.0, (50.0, 90.0), max_active=2) for i in range(n)]
    policy = FinishTime()
    for _ in range(burst):
        got = policy.choose(req, fleet).worker_id
        assert got == exhaustive(req, fleet)
        k = next(j for j, w in enumerate(fleet) if w.id == got)
        fleet[k] = fleet[k].replace(queued=(*fleet[k].queued, Load(req.prompt_tokens, 5)))
