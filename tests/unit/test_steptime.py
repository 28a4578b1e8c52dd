"""Step-time statistics, their wire form, and the monotone fit of decode rates."""

from __future__ import annotations

import math

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tandem.common.protocol import StepReport
from tandem.common.ratefit import fit_decode_rates, suspicious_points
from tandem.common.steptime import (
    CLIP,
    MAX_POINTS,
    MIN_AFTER_CONTEXT,
    SHIFT_RECENT,
    TRIM_MIN,
    WINDOW,
    StepModel,
    StepStats,
    center,
    context_slope,
)

H200_OUTLIER = [180, 11, 332, 560, 632, 748, 656, 698, 653, 571, 622, 793, 502, 606, 481, 529]


# ------------------------------------------------------------ the fit
def test_the_h200_outlier_profile_is_repaired_not_dragged_down() -> None:
    fit = fit_decode_rates(H200_OUTLIER)
    assert fit.dropped == (2,)
    assert fit.rates[0] == 180 and 180 < fit.rates[1] < 332  # between its neighbours
    assert fit.rates[2:4] == (332, 560)
    # The noisy plateau from batch 5 on is pooled into one level, never a dip.
    assert len(set(fit.rates[4:])) == 1 and 600 < fit.rates[4] < 640
    assert list(fit.rates) == sorted(fit.rates)


def test_weights_decide_which_side_of_a_violation_wins() -> None:
    assert fit_decode_rates([200, 150], [100, 1]).rates == pytest.approx((199.505, 199.505), 1e-3)
    assert fit_decode_rates([200, 150], [1, 100]).rates == pytest.approx((150.495, 150.495), 1e-3)


def test_fit_rejects_nonsense() -> None:
    for bad in ([], [1.0, 0.0], [math.nan], [-3.0]):
        with pytest.raises(ValueError):
            fit_decode_rates(bad)
    with pytest.raises(ValueError):
        fit_decode_rates([1.0, 2.0], [1.0])


def plausible_rates(min_size: int = 1) -> st.SearchStrategy[list[float]]:
    """Aggregate rates a device can have: never lower with more rows, and never
    more than b'/b times higher from b to b' rows (a step never gets shorter)."""

    def build(first: float, shares: list[float]) -> list[float]:
        out = [first]
        for b, u in enumerate(shares, 1):
            out.append(out[-1] * (1 + u / b))  # at most (b + 1) / b
        return out

    shares = st.lists(st.floats(0.0, 1.0), min_size=max(0, min_size - 1), max_size=23)
    return st.builds(build, st.floats(1.0, 1e4), shares)


@given(st.lists(st.floats(1e-3, 1e6), min_size=1, max_size=40),
       st.lists(st.floats(0.1, 1e4), min_size=40, max_size=40))  # fmt: skip
def test_fit_is_monotone_positive_and_within_the_input_range(rates, weights) -> None:
    fit = fit_decode_rates(rates, weights[: len(rates)])
    assert len(fit.rates) == len(rates)
    assert all(b >= a * (1 - 1e-12) for a, b in zip(fit.rates, fit.rates[1:], strict=False))
    assert min(rates) * (1 - 1e-9) <= min(fit.rates) and max(fit.rates) <= max(rates) * (1 + 1e-9)
    assert len(fit.dropped) <= max(1, len(rates) // 4) if len(rates) >= 3 else not fit.dropped


@given(plausible_rates())
def test_a_plausible_monotone_table_is_left_alone(rates) -> None:
    fit = fit_decode_rates(rates)
    assert fit.rates == pytest.approx(tuple(rates)) and fit.dropped == () and fit.pooled == ()


@given(plausible_rates(min_size=3), st.data(), st.floats(-7, 7))
def test_one_outlier_moves_no_other_point_more_than_3x(rates, data, log10_factor) -> None:
    """Whatever one point says (1e-7x to 1e7x its true value), every other batch size
    stays within 3x of the truth and the result stays monotone."""
    j = data.draw(st.integers(0, len(rates) - 1))
    noisy = list(rates)
    noisy[j] = rates[j] * 10**log10_factor
    fit = fit_decode_rates(noisy)
    for i, (got, true) in enumerate(zip(fit.rates, rates, strict=True)):
        if i != j:
            assert true / 3 <= got <= true * 3, (i, noisy, fit)
    # The outlier's own batch size: kept only while within 3x of what its neighbours
    # allow (an interval up to 3x wide), else replaced from them.
    assert rates[j] / 9 <= fit.rates[j] <= rates[j] * 9


def test_suspicious_points_name_stalls_and_spikes() -> None:
    assert suspicious_points(H200_OUTLIER) == (2,)
    assert suspicious_points([100, 190, 2000, 300, 320]) == (3,)
    assert suspicious_points([100, 190, 260, 300, 320]) == ()
    assert suspicious_points([50, 60]) == ()  # two points: no way to tell which is off


# ------------------------------------------------------------ worker-side statistics
def test_decode_steps_give_robust_step_seconds_by_batch_size() -> None:
    s = StepStats()
    for _ in range(10):
        s.record(batch=1, context_tokens=100, prefill_tokens=0, seconds=0.010)
        s.record(batch=4, context_tokens=400, prefill_tokens=0, seconds=0.016)
    s.record(batch=1, context_tokens=100, prefill_tokens=0, seconds=0.5)  # a JIT stall
    m = s.model()
    assert m.decode_batch == (1, 4) and m.decode_samples == (11, 10)
    # the stall counts as CLIP medians, not 50 of them
    assert m.decode_step_s == pytest.approx((0.010 * (1 + (CLIP - 1) / 11), 0.016))
    assert m.context == 100 and m.context_s == 0.0
    assert m.decode_tok_s()[4] == (pytest.approx(250.0), 10)


@given(st.lists(st.floats(0.005, 0.006), min_size=3, max_size=WINDOW - 1),
       st.floats(1e-6, 100.0))  # fmt: skip
def test_one_stalled_step_moves_the_estimate_by_at_most_clip_over_n(clean, stall) -> None:
    """However long the stall (a JIT compile, a GC pause), it counts for at most
    CLIP medians: a window of n moves by at most (CLIP - 1) / n of a step."""
    s = StepStats()
    for x in clean:
        s.record(2, 200, 0, x)
    s.record(2, 200, 0, stall)
    (step,) = s.model().decode_step_s
    n = len(clean) + 1
    if n < TRIM_MIN:  # the median of few
        assert min(clean) <= step <= max(clean)
    else:
        assert min(clean) * (n - 1) / n <= step <= max(clean) * (1 + (CLIP - 1) / n)


def test_a_recurring_right_skew_is_priced_as_a_run_of_steps_pays_it() -> None:
    """Every third step at 2x (the H200 GPU's slowest tenth ran 1.4-2.7x its median):
    a run of 60 steps takes 60 x 13.3 ms; a median would price it at 10 ms."""
    s = StepStats()
    for i in range(60):
        s.record(8, 800, 0, 0.020 if i % 3 == 0 else 0.010)
    (step,) = s.model().decode_step_s
    assert step == pytest.approx(0.040 / 3)


def test_stalls_count_for_at_most_clip_medians_and_few_samples_take_the_median() -> None:
    assert center([0.01, 0.01, 5.0]) == 0.01  # below TRIM_MIN: the median
    stalled = center([0.01] * 18 + [5.0, 7.0])  # two stalls in 20 samples
    assert stalled == pytest.approx(0.01 * (1 + 2 * (CLIP - 1) / 20))
    assert center([0.001, 0.001] + [0.01] * 18) == pytest.approx(0.0091)
    assert center([float(i) for i in range(1, 11)]) == pytest.approx(5.5)


def test_a_device_that_changes_speed_is_followed_within_a_few_checks() -> None:
    """A full window at 10 ms, then the device slows to 15 ms: the window keeps only
    the recent steps once their median is 25 % off, instead of needing half a
    window to get halfway (in the twin: a GPU slowing 1.5x mid-burst was priced at
    its old speed until the burst's last decisions)."""
    s = StepStats()
    for _ in range(WINDOW):
        s.record(4, 400, 0, 0.010)
    for _ in range(SHIFT_RECENT):
        s.record(4, 400, 0, 0.015)
    (step,) = s.model().decode_step_s
    assert step == pytest.approx(0.015)
    assert {v for v, _ in s.decode[4].samples} == {0.015}  # the old speed is gone


def test_a_recurring_tail_or_a_short_stall_is_no_change_of_speed() -> None:
    s = StepStats()
    for i in range(3 * WINDOW):  # every 5th step 2x: on both sides of any cut alike
        s.record(8, 800, 0, 0.020 if i % 5 == 0 else 0.010)
    assert len(s.decode[8].samples) == WINDOW
    for _ in range(SHIFT_RECENT // 2 - 1):  # 7 stalled steps in a row: not a new speed
        s.record(8, 800, 0, 0.5)
    assert len(s.decode[8].samples) == WINDOW


def test_a_change_of_context_is_left_to_the_slope_not_taken_for_a_new_speed() -> None:
    """Rows at 4,000 tokens of context after rows at 500 step slower because
    attention reads more: the window keeps both, for the slope to price."""
    s = StepStats()
    for _ in range(WINDOW - SHIFT_RECENT):
        s.record(4, 4 * 500, 0, 0.010)
    for _ in range(SHIFT_RECENT):
        s.record(4, 4 * 4000, 0, 0.020)
    assert len(s.decode[4].samples) == WINDOW


def test_prefill_rates_average_seconds_per_token_not_rates() -> None:
    """Chunks at 10k and 40k tok/s alternately take 62.5 us/token on average:
    16k tok/s, not the 25k a mean of the rates would claim."""
    s = StepStats()
    for i in range(20):
        s.record(0, 0, 256, 256 / (10_000 if i % 2 else 40_000))
    (rate,) = s.model().prefill_tok_s
    assert rate == pytest.approx(16_000)


def test_context_slope_separates_batch_cost_from_context_cost() -> None:
    s = StepStats()
    for i in range(40):
        x = 100 + 25 * i  # tokens of context per row
        for b in (1, 2):
            s.record(b, b * x, 0, 0.004 + 0.001 * b + 2e-6 * b * x)
    m = s.model()
    assert m.context_s == pytest.approx(2e-6)
    at = m.context  # step seconds are quoted at the median context
    assert m.decode_step_s == pytest.approx((0.005 + 2e-6 * at, 0.006 + 4e-6 * at))


def test_a_slope_is_kept_while_the_windows_span_too_little_context_to_measure_it() -> None:
    """Short prompts, then only long ones: the windows fill with steps at one long
    context, where no pairs are a context span apart. The slope measured on the short
    ones is kept (a slope of 0 would price the next short prompt at the long steps),
    and the steps are quoted at the new context."""
    s = StepStats()
    for i in range(64):
        x = 100 + i  # one row's context grows as it decodes
        s.record(4, 4 * x, 0, 0.010 + 5e-6 * 4 * x)
    assert s.model().context_s == pytest.approx(5e-6)
    for i in range(64):
        x = 2000 + i // 4  # a long row, its context barely moving within the window
        s.record(4, 4 * x, 0, 0.010 + 5e-6 * 4 * x)
    assert context_slope(s.decode) is None
    m = s.model()
    assert m.context_s == pytest.approx(5e-6)
    assert m.decode_step_s[0] == pytest.approx(0.010 + 5e-6 * 4 * m.context)
    assert m.context > 1900


def test_a_slope_needs_several_pairs_and_never_prices_a_step_near_zero() -> None:
    """One pair of steps a context span apart is one accident, not a slope; and even
    a real slope moves a sample to another context by at most MIN_AFTER_CONTEXT."""
    s = StepStats()
    for _ in range(10):
        s.record(16, 16 * 500, 0, 0.017)
    for x, secs in ((470, 0.010), (471, 0.010), (530, 0.020), (531, 0.010)):
        s.record(4, 4 * x, 0, secs)  # one pair >= MIN_CONTEXT_SPAN apart rises
    assert context_slope(s.decode) is None
    assert s.model().context_s == 0.0  # none ever measured
    assert s.model().decode_step_s[-1] == pytest.approx(0.017)  # batch 16 untouched

    s = StepStats()
    for i in range(40):  # a steep, real slope at batch 1 ...
        s.record(1, 100 + 25 * i, 0, 0.004 + 1e-5 * (100 + 25 * i))
    s.record(16, 16 * 60, 0, 0.017)  # ... and one batch-16 step at a short context
    m = s.model()
    (k,) = {m.context_s}
    assert k == pytest.approx(1e-5)
    assert m.decode_step_s[-1] >= MIN_AFTER_CONTEXT * 0.017


def test_prefill_rates_by_chunk_and_mixed_steps_split_by_the_decode_median() -> None:
    s = StepStats()
    s.record(0, 0, 256, 0.010)  # pure prefill: 25,600 tok/s in the 256 bucket
    s.record(3, 300, 100, 0.020)  # mixed, but batch 3 has no decode estimate yet: skipped
    for _ in range(3):
        s.record(3, 300, 0, 0.006)
    s.record(3, 300, 100, 0.011)  # 0.005 s of prefill for 100 tokens -> bucket 128
    s.record(3, 300, 4, 0.0061)  # prefill share too small to say anything
    m = s.model()
    assert m.prefill_chunk == (128, 256) and m.prefill_samples == (1, 1)
    assert m.prefill_tok_s == pytest.approx((20_000.0, 25_600.0))


def test_nonsense_samples_are_ignored() -> None:
    s = StepStats()
    for args in [(1, 0, 0, 0.0), (1, 0, 0, -1.0), (1, 0, 0, math.inf), (0, 0, 0, 0.1),
                 (-1, 0, 0, 0.1), (1, 0, -5, 0.1)]:  # fmt: skip
        s.record(*args)
    assert s.version == 0 and s.model().empty


def test_tables_stay_bounded() -> None:
    s = StepStats()
    for b in range(1, 3 * MAX_POINTS):
        s.record(b, b, 0, 0.01)
    assert len(s.decode) <= MAX_POINTS and len(s.model().decode_batch) <= MAX_POINTS
    assert all(len(w.samples) <= WINDOW for w in s.decode.values())


# ------------------------------------------------------------ wire form
@given(st.lists(st.tuples(st.integers(0, 64), st.integers(0, 5000), st.integers(0, 600),
                          st.floats(1e-5, 10.0)), max_size=200))  # fmt: skip
def test_any_recorded_model_round_trips_through_the_wire(samples) -> None:
    s = StepStats()
    for b, ctx, prefill, secs in samples:
        s.record(b, ctx * b, prefill, secs)
    m = s.model()
    assert StepModel.from_wire(m.to_wire()) == m


@pytest.mark.parametrize(
    "wire",
    [
        [],
        {"b": [1], "s": [0.1]},  # lengths differ
        {"b": [2, 1], "s": [0.1, 0.1], "n": [1, 1]},  # not increasing
        {"b": [0], "s": [0.1], "n": [1]},
        {"b": [1], "s": [math.nan], "n": [1]},
        {"b": [1], "s": [math.inf], "n": [1]},
        {"b": [1], "s": [0.0], "n": [1]},
        {"b": [1], "s": [0.1], "n": [0]},
        {"b": [True], "s": [0.1], "n": [1]},
        {"b": [1.0], "s": [0.1], "n": [1]},
        {"b": [1], "s": ["x"], "n": [1]},
        {
            "b": list(range(1, MAX_POINTS + 2)),
            "s": [0.1] * (MAX_POINTS + 1),
            "n": [1] * (MAX_POINTS + 1),
        },  # fmt: skip
        {"ctx": -1.0},
        {"k": math.nan},
        {"k": 2.0},
        {"pr": [1e12], "p": [1], "pn": [1]},
        {"zzz": 1},
    ],
)
def test_malformed_wire_models_are_refused(wire) -> None:
    """By the decoder (types and bounds: the heartbeat is refused) or by StepModel
    (rules across lists: the router ignores the model, keeps the heartbeat)."""
    with pytest.raises(ValueError):
        StepModel.from_wire(msgspec.msgpack.decode(msgspec.msgpack.encode(wire), type=StepReport))
