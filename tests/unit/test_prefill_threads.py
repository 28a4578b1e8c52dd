"""A CPU worker's prompt-chunk thread count (workers/backends/llama_threads.py): chosen
by what chunks cost a token, the other count tried again now and then, so a change of
load moves the choice."""

from __future__ import annotations

from tandem.workers.backends.llama_threads import EXPLORE_EVERY, MIN_TOKENS, PrefillThreads, choices


def serve(pt: PrefillThreads, cost_s: dict[int, float], chunks: int) -> list[int]:
    picked = []
    for _ in range(chunks):
        k = pt.pick()
        pt.record(k, cost_s[k] * 64, 64)
        picked.append(k)
    return picked


def test_each_count_is_tried_then_the_cheaper_kept_and_the_other_retried() -> None:
    pt = PrefillThreads((1, 2))
    picked = serve(pt, {1: 0.0023, 2: 0.0016}, 4 * EXPLORE_EVERY)
    assert picked[:2] == [1, 2]
    assert picked.count(1) == 1 + 4, "once to learn it, then once every EXPLORE_EVERY chunks"
    # The load changes: two threads now stall at their barrier; the choice follows.
    later = serve(pt, {1: 0.0023, 2: 0.0060}, 4 * EXPLORE_EVERY)
    assert later[-EXPLORE_EVERY:-1] == [1] * (EXPLORE_EVERY - 1)
    assert later[-1] == 2, "still retried now and then"


def test_small_chunks_do_not_count_and_one_choice_is_fixed() -> None:
    pt = PrefillThreads((1, 2))
    pt.record(2, 1.0, MIN_TOKENS - 1)
    assert pt.cost_s[2] is None
    fixed = PrefillThreads((3,))
    assert serve(fixed, {3: 0.001}, 30) == [3] * 30


def test_one_more_thread_only_where_a_core_is_spare_and_nothing_pins_the_worker() -> None:
    assert choices(1, pinned=False, cores=2) == (1, 2)
    assert choices(2, pinned=False, cores=2) == (2,)
    assert choices(1, pinned=True, cores=2) == (1,)
