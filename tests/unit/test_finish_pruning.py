"""finish_time's branch and bound never changes a decision.

Over random fleets (rates, batch tables that are not monotone, loads, prefix
hits, step budgets, context slopes, identical workers that tie), the pruning policy chooses what
the exhaustive one chooses; every score it computed is the exhaustive one's, and
every pruned candidate's logged bound is at most its exact score (to rounding) and above the
chosen score. Memoized answers (a second decision over the same views) agree too.
"""

from __future__ import annotations

import time
from pathlib import Path
from random import Random

from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from tandem.broker.decisions import DecisionLog, decision_record
from tandem.broker.policies import FinishTime, Load, RouteRequest, WorkerView
from tandem.broker.policies.finish import WRITES, _Memo, predict_finish_s
from tandem.broker.policies.lookahead import Lookahead
from tandem.cli.main import main

loads = st.lists(
    st.builds(Load, st.sampled_from([0, 0, 1, 7, 40, 300, 1200]), st.integers(0, 200)),
    max_size=10,
)


@st.composite
def views(draw: st.DrawFn) -> list[WorkerView]:
    out: list[WorkerView] = []
    for i in range(draw(st.integers(1, 12))):
        if out and draw(st.booleans()):  # a twin of an earlier worker: equal scores tie
            twin = draw(st.sampled_from(out))
            out.append(twin.replace(id=f"w{i}"))
            continue
        n = draw(st.integers(1, 6))
        rates = tuple(draw(st.floats(5.0, 2000.0)) for _ in range(n))
        active = draw(loads)
        out.append(
            WorkerView(
                f"w{i}",
                draw(st.floats(20.0, 20000.0)),
                rates,
                max_active=draw(st.integers(1, 8)),
                cached_tokens=draw(st.sampled_from([0, 0, 16, 256, 2048])),
                active=tuple(active),
                queued=tuple(draw(loads)),
                step_tokens=draw(st.sampled_from([1, 16, 256, 2048])),
                # Steps that slow with context (a live model's slope), quoted at some context:
                # each request's own context then moves its score (finish.context_extra_s).
                decode_context=draw(st.sampled_from([0.0, 100.0, 1500.0])),
                decode_context_s=draw(st.sampled_from([0.0, 0.0, 2e-6, 5e-5, 1e-3])),
            )
        )
    return out


requests = st.builds(
    RouteRequest, st.sampled_from([1, 17, 300, 516, 3000]), st.sampled_from([0, 1, 2, 64, 300])
)


@settings(max_examples=400, deadline=None)
@given(views(), requests, requests)
def test_pruning_never_changes_a_choice(fleet: list[WorkerView], req: RouteRequest,
                                        again: RouteRequest) -> None:  # fmt: skip
    pruning = FinishTime()
    for r in (req, again, req):  # the third is answered from the views' memos
        got = pruning.choose(r, fleet)
        want = FinishTime(prune=False).choose(r, [v.replace() for v in fleet])
        assert got.worker_id == want.worker_id
        assert not want.pruned
        # Pruned: above the KEEP-th least exact score, so never among the best KEEP.
        kth = sorted(want.scores.values())[min(FinishTime.KEEP, len(fleet)) - 1]
        for w in fleet:
            if w.id in got.pruned:
                bound, exact = got.scores[w.id], want.scores[w.id]
                assert kth < bound <= exact * (1 + 1e-12)  # rounding
            else:
                assert got.scores[w.id] == want.scores[w.id]


arrivals = st.lists(st.floats(0.0, 3.0), max_size=12).map(lambda xs: tuple(sorted(xs)))


@settings(max_examples=300, deadline=None)
@given(views(), requests, arrivals)
def test_lookahead_decides_alike_over_a_pruning_base(
    fleet: list[WorkerView], req: RouteRequest, recent: tuple[float, ...]
) -> None:
    """lookahead ranks finish_time's best few (FinishTime.KEEP covers its pool)."""
    assert Lookahead.CANDIDATES <= Lookahead.POOL <= FinishTime.KEEP
    r = RouteRequest(req.prompt_tokens, req.max_tokens, recent)
    exhaustive = Lookahead()
    exhaustive.base = FinishTime(prune=False)
    got = Lookahead().choose(r, fleet)
    assert got.worker_id == exhaustive.choose(r, [v.replace() for v in fleet]).worker_id


def _fleet() -> list[WorkerView]:
    """A slow worker and, beyond FinishTime.KEEP, fast ones (fast0 the least loaded)."""
    fast = [
        WorkerView(f"fast{i}", 5000.0, (100.0, 180.0), 2, active=(Load(0, 5),) * min(i, 1))
        for i in range(FinishTime.KEEP)
    ]
    return [WorkerView("slow", 50.0, (10.0,), 1, queued=(Load(400, 50),)), *fast]


def test_a_slow_worker_is_pruned_and_logged_with_its_bound():
    fleet = _fleet()
    slow, fast = fleet[0], fleet[1]
    req = RouteRequest(300, 16)
    d = FinishTime().choose(req, fleet)
    assert d.worker_id == "fast0" and d.pruned == frozenset({"slow"})
    assert d.scores["fast0"] == predict_finish_s(req, fast)
    assert d.scores["fast0"] < d.scores["slow"] <= predict_finish_s(req, slow)
    record = decision_record("r1", "finish_time", req, fleet, d)
    by_id = {c["id"]: c for c in record["candidates"]}
    assert by_id["slow"]["pruned"] is True and "pruned" not in by_id["fast0"]
    assert by_id["slow"]["score"] == d.scores["slow"]


def test_the_decisions_table_marks_a_pruned_score_as_a_bound(tmp_path: Path) -> None:
    fleet, req = _fleet(), RouteRequest(300, 16)
    log_path = tmp_path / "decisions.jsonl"
    log = DecisionLog(str(log_path), time.time)
    log.write(decision_record("r1", "finish_time", req, fleet, FinishTime().choose(req, fleet)))
    log.close()
    result = CliRunner().invoke(main, ["decisions", str(log_path)])
    assert result.exit_code == 0, result.output
    slow_row = next(line for line in result.stderr.splitlines() if " slow " in line)
    assert ">=" in slow_row


def _with_memo_copied(v: WorkerView) -> WorkerView:
    """``v`` as another object with a copy of its finish_time memo (answers so far)."""
    twin = v.replace()
    memo = v.memo.get("finish_time")
    if memo is not None:
        mine = twin.memo["finish_time"] = _Memo(v)
        mine.ahead, mine.answers = memo.ahead, dict(memo.answers)
    return twin


@settings(max_examples=300, deadline=None)
@given(views(), requests, st.lists(st.tuples(st.integers(0, 11), st.integers(0, 3)), max_size=12),
       st.randoms(use_true_random=False))  # fmt: skip
def test_a_burst_reusing_the_last_answers_decides_as_asking_every_worker(
    fleet: list[WorkerView], req: RouteRequest, changes: list[tuple[int, int]], rng: Random
) -> None:
    """FinishTime keeps a decision's answers for the next of the same shape, and asks
    only the workers whose view changed: same decision, scores and pruned set as a
    policy that asks every worker (over the same memos)."""
    policy = FinishTime()
    for pos, how in [(0, 0), *changes]:
        i = pos % len(fleet)
        if how == 1:  # the worker changed: a new view (new memo), its loads moved
            fleet[i] = fleet[i].replace(queued=(*fleet[i].queued, Load(3, 7)))
        elif how == 2:  # the prompt's prefix on it: a copy sharing its memo
            fleet[i] = fleet[i].with_cached(rng.choice([0, 16, 256]))
        r = req if how != 3 else RouteRequest(req.prompt_tokens + 1, req.max_tokens)
        reference = [_with_memo_copied(v) for v in fleet]  # the memos before this decision
        got = policy.choose(r, fleet)
        writes = WRITES.n
        want = FinishTime().choose(r, reference)
        WRITES.n = writes  # the reference wrote only to its own copies
        assert (got.worker_id, got.scores, got.pruned) == (want.worker_id, want.scores, want.pruned)


@st.composite
def fleets(draw: st.DrawFn) -> list[WorkerView]:
    """Up to 160 workers made from a few kinds (so both many ties and many pruned
    bounds, as a real fleet has): each a copy of one of ``views()``'s workers."""
    kinds = draw(views())
    n = draw(st.integers(1, 160))
    picks = draw(st.lists(st.integers(0, len(kinds) - 1), min_size=n, max_size=n))
    return [kinds[k].replace(id=f"f{i}") for i, k in enumerate(picks)]


@settings(max_examples=150, deadline=None)
@given(fleets(), requests, st.lists(st.tuples(st.integers(0, 159), st.integers(0, 2)), max_size=8))
def test_a_large_fleet_decides_as_exhaustive_scoring(
    fleet: list[WorkerView], req: RouteRequest, changes: list[tuple[int, int]]
) -> None:
    """The passes over every worker (exact scores, bounds split by the limit, ties)
    choose what scoring every worker chooses, decision after decision of a burst in
    which some workers' views change: busier, holding the prompt's prefix, or idle
    (then often the best, known only by its bound among many exact scores)."""
    pruning = FinishTime()
    for pos, how in [(0, 0), *changes]:
        i = pos % len(fleet)
        if how == 0:
            fleet[i] = fleet[i].replace(queued=(*fleet[i].queued, Load(5, 9)))
        elif how == 1:
            fleet[i] = fleet[i].with_cached(256)
        else:
            fleet[i] = fleet[i].replace(active=(), queued=())
        got = pruning.choose(req, fleet)
        want = FinishTime(prune=False).choose(req, [v.replace() for v in fleet])
        assert got.worker_id == want.worker_id
        for w in fleet:
            if w.id not in got.pruned:
                assert got.scores[w.id] == want.scores[w.id]
