"""common/pricing.py: the profile as a prior, the live step model where it has samples."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tandem.common.pricing import PRIOR_SAMPLES, price
from tandem.common.steptime import StepModel


def test_without_live_samples_the_repaired_profile_prices() -> None:
    r = price(500.0, [100.0, 4.0, 300.0], 5)
    assert r.decode_tok_s == (100.0, 200.0, 300.0, 300.0, 300.0)  # repaired, then a plateau
    assert r.repaired == (2,) and r.prefill_tok_s == 500.0
    assert r.live_decode_tok_s == (None,) * 5 and r.context_s == 0.0


def test_evidence_moves_a_batch_size_from_the_profile_to_the_measurement() -> None:
    few = price(500.0, [100.0], 1, StepModel((1,), (0.005,), (int(PRIOR_SAMPLES),)))
    assert few.decode_tok_s[0] == pytest.approx((100 * 200) ** 0.5)  # equal weights: geometric
    many = price(500.0, [100.0], 1, StepModel((1,), (0.005,), (100_000,)))
    assert many.decode_tok_s[0] == pytest.approx(200.0, rel=1e-3)


def test_unsampled_batch_sizes_keep_the_profile_shape_at_the_live_level() -> None:
    model = StepModel((1, 4), (0.02, 0.04), (100_000, 100_000))  # 50 and 100 tok/s
    r = price(500.0, [100.0, 150.0, 180.0, 200.0, 210.0], 5, model)
    # Factors 0.5 at 1 and 4: 2 and 3 in between scale alike; 5 borrows 4's factor,
    # less for the distance (log 0.5 / (1 + log2(5/4))), within 100 * 5/4.
    assert r.decode_tok_s[:4] == pytest.approx((50.0, 75.0, 90.0, 100.0), rel=1e-3)
    borrowed = 210 * 0.5 ** (1 / (1 + math.log2(5 / 4)))
    assert r.decode_tok_s[4] == pytest.approx(min(borrowed, 125.0), rel=1e-3)


def test_sizes_never_run_are_not_priced_beyond_what_physics_allows() -> None:
    model = StepModel((2,), (0.02,), (100_000,))  # 100 tok/s at batch 2
    r = price(500.0, [1e4] * 8, 8, model)  # a profile 100x too fast
    at2 = r.decode_tok_s[1]
    assert at2 == pytest.approx(100.0, rel=1e-3)
    assert at2 / 2 <= r.decode_tok_s[0] <= at2
    assert all(x <= at2 * b / 2 * (1 + 1e-9) for b, x in enumerate(r.decode_tok_s[1:], 2))


def test_prefill_uses_the_largest_chunk_that_says_something() -> None:
    small = StepModel(prefill_chunk=(16,), prefill_tok_s=(50.0,), prefill_samples=(10_000,))
    assert price(1000.0, [10.0], 1, small).prefill_tok_s == 1000.0  # overhead-bound: ignored
    big = StepModel(prefill_chunk=(16, 256), prefill_tok_s=(50.0, 2000.0),
                    prefill_samples=(10_000, 100_000))  # fmt: skip
    assert price(1000.0, [10.0], 1, big).prefill_tok_s == pytest.approx(2000.0, rel=1e-3)


@given(
    st.lists(st.floats(1.0, 1e5), min_size=1, max_size=16),
    st.dictionaries(st.integers(1, 16), st.tuples(st.floats(1e-4, 1.0), st.integers(1, 10**6))),
)
def test_priced_rates_are_monotone_and_positive(profile, live) -> None:
    batches = sorted(live)
    model = StepModel(tuple(batches), tuple(live[b][0] for b in batches),
                      tuple(live[b][1] for b in batches))  # fmt: skip
    r = price(100.0, profile, 16, model)
    assert len(r.decode_tok_s) == 16 and min(r.decode_tok_s) > 0
    assert all(
        b >= a * (1 - 1e-9) for a, b in zip(r.decode_tok_s, r.decode_tok_s[1:], strict=False)
    )
