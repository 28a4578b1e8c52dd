"""Prefix cache index and block advertisement: pure Python, no model."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tandem.common.blocks import CacheLog, CacheView, block_hashes, matched_tokens
from tandem.workers.prefix_cache import PrefixCache

BS = 4


def seq(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


def test_block_hashes_chain_whole_prefixes():
    a, b = seq(12), seq(8) + [99, 99, 99, 99]
    ha, hb = block_hashes(a, BS), block_hashes(b, BS)
    assert len(ha) == 3 and ha[:2] == hb[:2] and ha[2] != hb[2]
    assert block_hashes(seq(11), BS) == ha[:2]  # partial tail ignored
    # Same block content at a different depth hashes differently (chained).
    assert block_hashes([0, 1, 2, 3] * 2, BS)[1] != block_hashes([0, 1, 2, 3], BS)[0]
    assert all(0 <= h < 2**63 for h in ha)


def test_match_is_block_aligned_and_leaves_one_token():
    c = PrefixCache(BS, capacity_tokens=100, max_entries=4)
    entry, freed = c.insert(seq(10), handle="h1")
    assert entry is not None and freed == []
    assert c.match(seq(10)).n_tokens == 8  # 2 full blocks held, and < len(prompt)
    assert c.match(seq(9)).n_tokens == 8
    assert c.match(seq(8)).n_tokens == 4  # must leave >= 1 token to compute
    assert c.match(seq(3)).n_tokens == 0
    assert c.match([7] + seq(9, 1)).entry is None
    assert c.match(seq(20)).entry is entry


def test_router_estimate_equals_worker_match():
    c = PrefixCache(BS, 100, 4)
    c.insert(seq(13), "h")
    view = CacheView()
    assert view.apply(c.log.report())
    for n in range(1, 20):
        prompt = seq(n)
        usable = (n - 1) // BS * BS
        est = matched_tokens(block_hashes(prompt[:usable], BS), view.held, BS)
        assert est == c.match(prompt).n_tokens


def test_insert_skips_covered_and_drops_superseded_entries():
    c = PrefixCache(BS, 100, 4)
    short, _ = c.insert(seq(8), "short")
    assert c.insert(seq(6), "shorter") == (None, ["shorter"])  # already covered
    long_, freed = c.insert(seq(16), "long")
    assert freed == ["short"] and list(c.entries) == [long_.id]
    assert c.insert(seq(3), "tiny") == (None, ["tiny"])  # no full block


def test_lru_eviction_under_token_and_entry_budgets_spares_pinned():
    c = PrefixCache(BS, capacity_tokens=20, max_entries=3, policy="lru")
    a, _ = c.insert(seq(8, 100), "a")
    b, _ = c.insert(seq(8, 200), "b")
    c.pin(a)
    c.match(seq(8, 200))  # touch b: a is older but pinned
    _, freed = c.insert(seq(8, 300), "c")
    assert freed == ["b"]
    assert c.tokens_held <= 20
    c.unpin(a)
    assert c.evict_one() == "a"


def test_entry_limit_is_enforced():
    c = PrefixCache(BS, capacity_tokens=1000, max_entries=2)
    for i in range(5):
        c.insert(seq(8, 100 * i), f"h{i}")
    assert len(c.entries) == 2


def test_pinned_everything_refuses_new_entries():
    c = PrefixCache(BS, capacity_tokens=8, max_entries=4)
    a, _ = c.insert(seq(8, 100), "a")
    c.pin(a)
    assert c.insert(seq(8, 200), "b") == (None, ["b"])


def test_cache_log_deltas_and_gaps():
    log, view = CacheLog(), CacheView()
    log.add([1, 2])
    assert view.apply(log.report())  # first report is a full listing
    assert view.held == {1, 2}
    log.add([2, 3])  # 2 is refcounted: no change on the wire
    log.remove([1])
    rep = log.report()
    assert rep.added == [3] and rep.removed == [1]
    assert view.apply(rep) and view.held == {2, 3}
    log.remove([2])
    assert view.held == {2, 3}  # not reported yet
    log.remove([2])
    lost = log.report()  # this delta is "lost"
    log.add([9])
    assert not view.apply(log.report()), "a gap must be detected"
    assert view.held == {2, 3}, "a delta that did not apply changes nothing"
    assert view.apply(lost) and view.held == {3}  # the late delta still fits in order
    log.request_full()
    assert view.apply(log.report()) and view.held == {3, 9}


def test_repeated_reports_are_idempotent():
    log, view = CacheLog(), CacheView()
    log.add([5])
    first = log.report()
    assert view.apply(first) and view.apply(first)
    log.add([6])
    delta = log.report()
    assert view.apply(delta) and view.apply(delta)
    assert view.held == {5, 6}
    empty = log.report()
    assert view.apply(empty) and view.held == {5, 6}


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 6)), max_size=40))
def test_view_tracks_the_log_through_any_sequence(ops):
    log, view = CacheLog(), CacheView()
    held: dict[int, int] = {}
    for add, h in ops:
        if add:
            log.add([h])
            held[h] = held.get(h, 0) + 1
        elif held.get(h):
            log.remove([h])
            held[h] -= 1
        assert view.apply(log.report())
        assert view.held == {k for k, n in held.items() if n > 0}


def test_a_finished_prompt_counts_as_cached_until_reports_have_had_their_time():
    log, view = CacheLog(), CacheView()
    log.add([1])
    assert view.apply(log.report(), now=0.0) and view.held == {1}
    view.note([1, 2, 3], until=1.0)  # finished there; the next heartbeat is not in yet
    assert view.held == {1, 2, 3}
    assert view.apply(log.report(), now=0.5) and view.held == {1, 2, 3}  # a stale report
    log.add([2])
    assert view.apply(log.report(), now=0.9) and view.held == {1, 2, 3}
    assert view.apply(log.report(), now=1.0)  # past its time: only what was reported
    assert view.held == {1, 2}
    log.remove([1])  # a reported block goes even while an older note is out
    view.note([4], until=5.0)
    assert view.apply(log.report(), now=2.0) and view.held == {2, 4}
    log.request_full()
    assert view.apply(log.report(), now=3.0) and view.held == {2, 4}  # a full listing keeps notes
    view.expire(5.0)
    assert view.held == {2}


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "remove", "note"]), st.integers(0, 6)),
                max_size=40))  # fmt: skip
def test_held_is_always_what_was_reported_plus_notes_in_time(ops):
    log, view = CacheLog(), CacheView()
    held: dict[int, int] = {}
    notes: dict[int, float] = {}
    for now, (op, h) in enumerate(ops):
        if op == "add":
            log.add([h])
            held[h] = held.get(h, 0) + 1
        elif op == "remove" and held.get(h):
            log.remove([h])
            held[h] -= 1
        elif op == "note":
            view.note([h], until=now + 3)
            notes[h] = now + 3
        assert view.apply(log.report(), now=float(now))
        reported = {k for k, n in held.items() if n > 0}
        # A note for a block the reports already held is not kept.
        live = {k for k, until in notes.items() if until > now}
        assert reported <= view.held <= reported | live
