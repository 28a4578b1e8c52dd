"""The robustness suite, CI-sized: the default policy against wrong, noisy and stale prices.

The full suite (8 cases) runs with ``tandem sim robustness``; its numbers are in
docs/results/twin/. Here one 16-burst (GPU max active 8) holds the bar of issue
13 for the default policy: within 5 % of its correctly priced makespan and never
more than 2 % worse than least_loaded, except where noted. The skewed GPU (every
5th step 2x) held neither bar with median step estimates (+5.5 % vs a steady GPU
as fast on a run of steps); with clipped means it is +0.1 %.
"""

from __future__ import annotations

import pytest

from tandem.broker.policies import DEFAULT_POLICY
from tandem.twin.robustness import (
    LIMIT_VS_CORRECT,
    LIMIT_VS_LEAST_LOADED,
    SCENARIOS,
    run_suite,
)

# None since the GPU measures itself at start (workers.profiler.warm_up): its understated
# batch scaling (+17.6 % vs correct prices here before) is replaced by what it measured.
KNOWN_MISSES: set[str] = set()


def encode(text: str) -> list[int]:
    return [1000 + ord(c) % 500 for c in text]


@pytest.fixture(scope="module")
def rows():
    return run_suite(encode, [DEFAULT_POLICY], small=True)


def test_the_default_is_never_worse_than_least_loaded(rows):
    mine = [r for r in rows if r["policy"] == DEFAULT_POLICY]
    assert len(mine) == len(SCENARIOS)
    assert all(r["vs_least_loaded"] <= LIMIT_VS_LEAST_LOADED for r in mine), mine


def test_the_default_stays_near_its_correctly_priced_result(rows):
    mine = [r for r in rows if r["policy"] == DEFAULT_POLICY]
    held = {r["scenario"] for r in mine if r["vs_correct"] <= LIMIT_VS_CORRECT}
    assert held | KNOWN_MISSES >= {r["scenario"] for r in mine}
    outlier = next(r for r in mine if r["scenario"].startswith("outlier"))
    assert outlier["vs_correct"] <= LIMIT_VS_CORRECT  # the 11 tok/s profile entry is harmless
    skewed = next(r for r in mine if r["scenario"] == "gpu steps skewed")
    assert skewed["vs_correct"] <= LIMIT_VS_CORRECT  # priced as a run of its steps pays
