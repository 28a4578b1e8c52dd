"""The twin's oracle: pinned replays, an exhaustive search that finds the known best
placement, the served-rate device model, and a bench result annotated end to end."""

from __future__ import annotations

import pytest

from tandem.bench.calibrate import group_served
from tandem.bench.workload import PromptBook, Workload
from tandem.twin.oracle import PlacementSearch, annotate, served_devices
from tandem.twin.replay import replay
from tests.unit.test_twin import encode, fleet


def _burst(n: int) -> tuple[Workload, PromptBook]:
    wl = Workload(kind="burst", requests=n, spacing_s=0.05, same_prompt=True)
    return wl, PromptBook(encode, wl)


def test_a_placement_pins_every_request_whatever_the_policy():
    wl, book = _burst(6)
    pins = {i: "cpu-m2" if i % 3 == 0 else "gpu-m2" for i in range(6)}
    rep = replay(fleet(), "forced:gpu-m2", wl.arrivals(0), book, placement=pins)
    assert {r.index: r.worker for r in rep.records} == pins


def test_the_exhaustive_search_beats_or_ties_every_policy_and_knows_its_own():
    """4 requests on two workers: all 16 placements tried; the best is at least as
    good as any policy's placement replayed, and a replayed placement costs what the
    policy's own replay measured."""
    wl, book = _burst(4)
    search = PlacementSearch(fleet(), wl.arrivals(0), book, seeds_prefix=True)
    best = search.best([])
    assert best.exact and best.replays == 16
    for policy in ("least_loaded", "round_robin", "forced:gpu-m2", "finish_time"):
        rep = replay(fleet(), policy, wl.arrivals(0), book)
        t0 = min(r.submit_s for r in rep.records)
        own = tuple(r.worker for r in sorted(rep.records, key=lambda r: r.index))
        measured = max(r.token_s[-1] for r in rep.records) - t0
        assert search.makespan(own) == pytest.approx(measured, abs=1e-9)
        assert best.makespan_s <= measured + 1e-9
    assert best.to_json(search.makespan(best.placement))["own_makespan_s"] == best.makespan_s


def test_a_climb_from_poor_starts_finds_what_the_exhaustive_search_finds():
    wl, book = _burst(8)  # 256 placements: compare the climb against every one
    arr = wl.arrivals(0)
    exact = PlacementSearch(fleet(), arr, book, True).best([])
    climb = PlacementSearch(fleet(), arr, book, True)
    import tandem.twin.oracle as oracle

    limit, oracle.EXHAUSTIVE_MAX = oracle.EXHAUSTIVE_MAX, 1
    try:
        found = climb.best([("cpu-m2",) * 8], budget=120)
    finally:
        oracle.EXHAUSTIVE_MAX = limit
    assert not found.exact and found.replays <= 120
    assert found.makespan_s <= exact.makespan_s * 1.02


def test_served_rates_become_devices_and_a_result_is_annotated():
    """A bench-shaped document: the group's median served rates build the devices,
    every run gets the same best and its own placement replayed."""
    wl, _ = _burst(4)
    served = {
        "cpu-m2": {"prefill_tok_s": 80.0, "decode_tok_s": [40.0, 60.0]},
        "gpu-m2": {"prefill_tok_s": 3000.0, "decode_tok_s": [30.0, 55.0]},
    }
    faster = {
        w: {**r, "decode_tok_s": [2 * x for x in r["decode_tok_s"]]} for w, r in served.items()
    }

    def run(place: list[str], rates: dict) -> dict:
        recs = [{"index": i, "worker": w} for i, w in enumerate(place)]
        return {"run": 0, "records": recs, "served_rates": rates, "metrics": {"makespan_s": 3.0}}

    group = {
        "label": "g", "max_active": 2, "workload": wl.to_json(),
        "cases": [{"router_policy": "forced:gpu-m2", "runs": [run(["gpu-m2"] * 4, served)]},
                  {"router_policy": "finish_time",
                   "runs": [run(["cpu-m2", "gpu-m2"] * 2, faster)]}],
    }  # fmt: skip
    model = group_served(group)
    assert model["cpu-m2"]["decode_tok_s"] == [60.0, 90.0]  # the median of 40/80, 60/120
    # From the runs that used every worker only: the split run's rates alone.
    assert group_served(group, "shared")["cpu-m2"]["decode_tok_s"] == [80.0, 120.0]
    # Alone: per worker, the runs that used it alone (none for the CPU: all runs).
    alone = group_served(group, "alone")
    assert alone["gpu-m2"]["decode_tok_s"] == [30.0, 55.0]
    assert alone["cpu-m2"]["decode_tok_s"] == [60.0, 90.0]
    specs = served_devices(model, {"cpu-m2": 2, "gpu-m2": 2})
    assert specs[0].profile.decode_step_s == pytest.approx((1 / 60, 2 / 90))
    doc = {"config": {"seed": 0, "workers": [{"id": "cpu-m2", "spec": "sim:cpu-m2:id=cpu-m2"},
                                             {"id": "gpu-m2", "spec": "sim:gpu-m2:id=gpu-m2"}]},
           "groups": [group]}  # fmt: skip
    assert annotate(doc, encode) == 2
    a, b = (c["runs"][0]["twin_oracle"] for c in group["cases"])
    assert a["makespan_s"] == b["makespan_s"] and a["exact"]
    assert min(a["own_makespan_s"], b["own_makespan_s"]) >= a["makespan_s"]
    assert sum(a["requests"].values()) == 4
    summary = group["cases"][0]["summary"]  # recomputed: the report shows the twin's split
    assert summary["twin_placement_loss"]["mean"] == pytest.approx(
        a["own_makespan_s"] / a["makespan_s"]
    )
    # The policy replayed on the twin's prices: forced:gpu places what its run did,
    # and the placement loss splits into pricing x objective.
    assert a["policy_makespan_s"] == pytest.approx(a["own_makespan_s"])
    assert b["policy_makespan_s"] >= b["makespan_s"] - 1e-9
    s = group["cases"][1]["summary"]
    assert s["twin_pricing_loss"]["mean"] * s["twin_objective_loss"]["mean"] == pytest.approx(
        s["twin_placement_loss"]["mean"]
    )


def test_one_worker_placements_replay_on_the_alone_devices():
    """The placement-aware model: a split placement runs on the shared runs' speeds,
    everything-on-one-worker on the speeds that worker served at alone."""
    wl, book = _burst(4)
    arr = wl.arrivals(0)
    fast = {
        "cpu-m2": {"prefill_tok_s": 80.0, "decode_tok_s": [40.0, 60.0]},
        "gpu-m2": {"prefill_tok_s": 3000.0, "decode_tok_s": [60.0, 110.0]},
    }
    slow = {w: {**r, "decode_tok_s": [x / 2 for x in r["decode_tok_s"]]} for w, r in fast.items()}
    active = {"cpu-m2": 2, "gpu-m2": 2}
    mixed = PlacementSearch(served_devices(fast, active), arr, book, True,
                            alone=served_devices(slow, active))  # fmt: skip
    only_fast = PlacementSearch(served_devices(fast, active), arr, book, True)
    only_slow = PlacementSearch(served_devices(slow, active), arr, book, True)
    alone, split = ("gpu-m2",) * 4, ("cpu-m2", "gpu-m2") * 2
    assert mixed.makespan(alone) == only_slow.makespan(alone) > only_fast.makespan(alone)
    assert mixed.makespan(split) == only_fast.makespan(split)


def test_per_run_speeds_give_each_run_its_own_best():
    """served_from="run": a run is measured against the best placement on the speeds
    served in that run, so a run on a box that drifted slower is not charged the drift
    (its best is slower too), and each best is the search over that run's rates."""
    wl, book = _burst(4)
    fast = {
        "cpu-m2": {"prefill_tok_s": 80.0, "decode_tok_s": [40.0, 60.0]},
        "gpu-m2": {"prefill_tok_s": 3000.0, "decode_tok_s": [60.0, 110.0]},
    }
    slow = {w: {**r, "decode_tok_s": [x / 2 for x in r["decode_tok_s"]]} for w, r in fast.items()}

    def run(index: int, rates: dict) -> dict:
        recs = [{"index": i, "worker": "gpu-m2"} for i in range(4)]
        return {"run": index, "records": recs, "served_rates": rates,
                "metrics": {"makespan_s": 3.0}}  # fmt: skip

    group = {"label": "g", "max_active": 2, "workload": wl.to_json(),
             "cases": [{"router_policy": "forced:gpu-m2",
                        "runs": [run(0, fast), run(1, slow)]}]}  # fmt: skip
    doc = {"config": {"seed": 0, "workers": [{"id": "cpu-m2", "spec": "sim:cpu-m2:id=cpu-m2"},
                                             {"id": "gpu-m2", "spec": "sim:gpu-m2:id=gpu-m2"}]},
           "groups": [group]}  # fmt: skip
    assert annotate(doc, encode, served_from="run") == 2
    on_fast, on_slow = (r["twin_oracle"] for r in group["cases"][0]["runs"])
    assert on_slow["makespan_s"] > on_fast["makespan_s"]
    assert on_slow["own_makespan_s"] > on_fast["own_makespan_s"]
    active = {"cpu-m2": 2, "gpu-m2": 2}
    for rates, seed, res in ((fast, 0, on_fast), (slow, 1, on_slow)):
        search = PlacementSearch(served_devices(rates, active), wl.arrivals(seed), book, True)
        assert res["makespan_s"] == pytest.approx(search.best([("gpu-m2",) * 4]).makespan_s)
        assert res["own_makespan_s"] == pytest.approx(search.makespan(("gpu-m2",) * 4))
    assert group["twin_served_from"] == "run"
    with pytest.raises(ValueError, match="served_from"):
        annotate(doc, encode, served_from="median")
