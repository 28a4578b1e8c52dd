"""Every policy routes real requests across a real llama.cpp worker and a sim worker."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tandem.client import AsyncClient
from tandem.launcher.cluster import Cluster, WorkerSpec
from tests.helpers import LLAMA_ARGS, needs_llama

pytestmark = [needs_llama, pytest.mark.model]

PROFILE = Path(__file__).resolve().parent.parent / "deploy" / "profiles" / "gpu-m2.json"
POLICIES = [
    "lookahead",
    "finish_time",
    "phase_cost",
    "least_tokens",
    "cache_aware",
    "least_loaded",
    "round_robin",
    "forced:cpu0",
]


@pytest.mark.parametrize("policy", POLICIES)
def test_policy_serves_a_mixed_cluster(policy, tmp_path):
    log = tmp_path / "decisions.jsonl"
    workers = [
        WorkerSpec("cpu0", LLAMA_ARGS),
        WorkerSpec("sim0", ["--backend", "sim", "--profile", str(PROFILE), "--heartbeat-s", "0.2"]),
    ]
    router = ["--policy", policy, "--decision-log", str(log)]
    with Cluster(workers=workers, router_args=router) as cl:

        async def burst() -> list:
            async with AsyncClient(cl.client_addr) as ac:
                jobs = [
                    ac.generate(f"Question {i}?", max_tokens=6, ignore_eos=True) for i in range(4)
                ]
                return await asyncio.gather(*jobs)

        results = asyncio.run(burst())
    assert all(len(r.token_ids) == 6 for r in results)
    assert {r.stats["policy"] for r in results} == {policy}
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert len(lines) == 4
    by_id = {r.request_id: r for r in results}
    for rec in lines:
        assert rec["policy"] == policy
        assert rec["choice"] == by_id[rec["request"]].worker
        assert {c["id"] for c in rec["candidates"]} == {"cpu0", "sim0"}
    chosen = {rec["choice"] for rec in lines}
    assert chosen == {r.worker for r in results}
    if policy == "forced:cpu0":
        assert chosen == {"cpu0"}
    if policy == "round_robin":
        assert chosen == {"cpu0", "sim0"}
    # The router told every policy of the burst's earlier arrivals (lookahead reads them).
    told = sorted(len(rec.get("arrivals_before", [])) for rec in lines)
    assert told == [0, 1, 2, 3]
