"""The shared engine: admission, step planning, stops, cancel, cache reuse, KV pressure."""

from __future__ import annotations

import time

import pytest

from tandem.common import protocol as p
from tandem.common.protocol import SamplingParams
from tandem.common.steptime import StepModel
from tandem.workers.engine import Engine, EngineConfig
from tandem.workers.request import Request, Status
from tests.helpers import EOS, FakeBackend


def make(max_active=2, step_tokens=8, block_size=4, cache_tokens=64, **kw):
    backend = FakeBackend(**kw)
    out: list[p.Message] = []
    cfg = EngineConfig(
        max_active=max_active,
        step_tokens=step_tokens,
        block_size=block_size,
        cache_tokens=cache_tokens,
        cache_entries=8,
        heartbeat_s=0.5,
        max_tokens_limit=64,
    )
    return Engine(backend, cfg, out.append, "w0"), backend, out


def req(rid, n=6, max_tokens=3, start=1, **kw):
    return Request(rid, list(range(start, start + n)), SamplingParams(max_tokens=max_tokens, **kw))


def run_all(engine, limit=200):
    for _ in range(limit):
        if not (engine.queue or engine.active):
            return
        engine.step()
    raise AssertionError("engine did not drain")


def done(out):
    return {m.request_id: m for m in out if isinstance(m, p.Done)}


def test_fifo_admission_respects_the_cap():
    e, _, _ = make(max_active=2)
    for i in range(4):
        e.submit(req(f"r{i}", start=1 + 10 * i))  # no shared prefix: none waits for another
    e.admit()
    assert [r.id for r in e.active] == ["r0", "r1"]
    assert [r.id for r in e.queue] == ["r2", "r3"]


def test_decode_goes_first_then_prefill_chunks_within_the_budget():
    e, b, _ = make(max_active=3, step_tokens=8)
    e.submit(req("a", n=4, max_tokens=5))
    e.step()  # a: whole prompt in one step, first token sampled
    e.submit(req("b", n=20))
    e.submit(req("c", n=20))
    e.step()
    decode, prefill = b.steps[-1]
    assert decode == ["a"]
    assert prefill == [("b", 7)]  # 8 - 1 decode token; c waits for budget
    e.step()
    assert b.steps[-1] == (["a"], [("b", 7)])


def test_generation_runs_to_length_and_reports_stats():
    e, b, out = make()
    e.submit(req("a", max_tokens=3))
    run_all(e)
    d = done(out)["a"]
    assert d.finish_reason == "length"
    texts = "".join(m.text for m in out if isinstance(m, p.TokenDelta))
    assert texts == "<100><101><102>"
    assert d.stats.output_tokens == 3 and d.stats.prompt_tokens == 6
    assert d.stats.worker == "w0"


def test_eos_stops_unless_ignored():
    e, b, out = make()
    b.script = {"a": [7, EOS, 8], "b": [7, EOS, 8]}
    e.submit(req("a", max_tokens=5))
    e.submit(req("b", max_tokens=3, ignore_eos=True))
    run_all(e)
    d = done(out)
    assert d["a"].finish_reason == "eos" and d["a"].stats.output_tokens == 1
    assert d["b"].finish_reason == "length" and d["b"].stats.output_tokens == 3


def test_stop_string_ends_generation_and_is_not_emitted():
    e, b, out = make()
    e.submit(req("a", max_tokens=10, stop=["<102>"]))
    run_all(e)
    assert done(out)["a"].finish_reason == "stop"
    assert "".join(m.text for m in out if isinstance(m, p.TokenDelta)) == "<100><101>"


def test_cancel_queued_and_active_is_idempotent():
    e, _, out = make(max_active=1)
    e.submit(req("a", max_tokens=50))
    e.submit(req("b"))
    e.step()
    e.cancel("b")
    e.cancel("a")
    e.cancel("a")
    e.cancel("never-seen")
    d = done(out)
    assert d["a"].finish_reason == "cancelled" and d["b"].finish_reason == "cancelled"
    assert not e.active and not e.queue


def test_cache_hit_skips_prefill_work():
    e, b, out = make(max_active=1, step_tokens=64, block_size=4)
    prefix = list(range(1, 17))
    e.submit(Request("seed", prefix, SamplingParams(max_tokens=1, prefill_only=True)))
    run_all(e)
    assert done(out)["seed"].finish_reason == "prefill_only"
    fed_before = b.fed
    e.submit(Request("hit", prefix + [50, 51, 52], SamplingParams(max_tokens=2)))
    run_all(e)
    d = done(out)["hit"]
    assert d.stats.cached_tokens == 16
    assert b.fed - fed_before == 3, "only the uncached tail is computed"
    hb = e.heartbeat()
    assert hb.cache.full is True and len(hb.cache.blocks) >= 4


def test_kv_pressure_evicts_cache_entries_before_failing_requests():
    e, b, out = make(max_active=1, step_tokens=64, block_size=4, kv_cells=40)
    e.submit(Request("old", list(range(100, 124)), SamplingParams(max_tokens=1, prefill_only=True)))
    run_all(e)
    assert len(e.cache.entries) == 1
    e.submit(Request("new", list(range(200, 230)), SamplingParams(max_tokens=4)))
    run_all(e)
    assert done(out)["new"].finish_reason == "length"
    assert all(ent.tokens[0] != 100 for ent in e.cache.entries.values()), "old entry evicted"


def test_kv_exhaustion_with_nothing_to_evict_fails_one_request_cleanly():
    e, b, out = make(max_active=2, step_tokens=64, kv_cells=14, cache_tokens=0)
    e.submit(req("a", n=8, max_tokens=4))
    e.submit(req("b", n=8, max_tokens=4))
    run_all(e)
    errors = [m for m in out if isinstance(m, p.Error)]
    assert [m.request_id for m in errors] == ["b"] and errors[0].code == p.OVERLOADED
    assert done(out)["a"].finish_reason == "length"
    assert not e.active


@pytest.mark.parametrize(
    ("request_", "code"),
    [
        (Request("x", [], SamplingParams(max_tokens=3)), p.BAD_REQUEST),
        (Request("x", [1, 5000], SamplingParams(max_tokens=3)), p.BAD_REQUEST),
        (Request("x", [1], SamplingParams(max_tokens=0)), p.BAD_REQUEST),
        (Request("x", [1], SamplingParams(max_tokens=65)), p.BAD_REQUEST),
        (Request("x", [1] * 60, SamplingParams(max_tokens=10)), p.PROMPT_TOO_LONG),
    ],
)
def test_bad_assignments_get_errors_not_crashes(request_, code):
    e, _, out = make(n_ctx=64)
    e.submit(request_)
    assert isinstance(out[-1], p.Error) and out[-1].code == code
    assert not e.queue


def test_heartbeat_lists_remaining_work():
    e, _, _ = make(max_active=1, step_tokens=4)
    e.submit(req("a", n=6, max_tokens=5))
    e.submit(req("b", n=6, max_tokens=5))
    e.step()  # a: 4 of 6 prompt tokens
    hb = e.heartbeat()
    (a,) = hb.active
    (b,) = hb.queued
    assert a == p.RequestRow("a", prompt=6, cached=0, prefill_remaining=2, decode_remaining=5)
    assert b.prefill_remaining == 6 and b.decode_remaining == 5
    assert e.active[0].status is Status.PREFILL


def test_a_backend_failure_fails_the_step_and_the_engine_keeps_serving():
    e, b, out = make()
    real_run = b.run

    def broken(decode, prefill):
        raise RuntimeError("device lost")

    b.run = broken
    e.submit(req("a"))
    e.step()
    (err,) = [m for m in out if isinstance(m, p.Error)]
    assert err.request_id == "a" and err.code == p.WORKER_ERROR and "device lost" in err.message
    assert not e.active and not e.cache.entries, "a failed request's KV is not cached"
    b.run = real_run
    e.submit(req("b"))
    run_all(e)
    assert done(out)["b"].finish_reason == "length"


def test_full_block_listing_is_resent_periodically():
    import time as _time

    e, _, _ = make()
    e.cache.log.report()  # consume the initial full listing
    assert e.heartbeat().cache.full is False
    e._last_full = _time.monotonic() - e.cfg.full_resync_s - 1
    out_before = len(e.emit.__self__)
    e.maybe_heartbeat()
    hb = e.emit.__self__[out_before]
    assert isinstance(hb, p.Heartbeat) and hb.cache.full is True


def test_warm_up_runs_a_full_chunk_and_every_power_of_two_batch_then_holds_nothing() -> None:
    from tandem.workers.profiler import warm_up

    backend = FakeBackend()
    backend.is_eog = lambda token: False  # the fake's scripted EOS must not end decodes early
    lengths: list[list[int]] = []
    run = backend.run

    def spy(decode, prefill):
        lengths.append([len(r.prompt) for r in decode])
        return run(decode, prefill)

    backend.run = spy
    warm_up(backend, max_active=6, step_tokens=32)
    chunks = {n for _, prefill in backend.steps for _, n in prefill}
    assert 32 in chunks  # a full prefill chunk, then the rest of the prompt
    batches = {len(decode) for decode, _ in backend.steps if decode}
    assert {1, 2, 4, 6} <= batches
    # Rows of unequal length, as serving's are (a ragged batch takes MLX's masked path).
    assert all(len(set(rows)) == len(rows) for rows in lengths)
    assert not backend.kv  # every warm-up request's KV was released


def test_warm_up_prompts_never_outgrow_the_context_it_fits_to_n_ctx() -> None:
    """Many rows over a short context: the rows' spread narrows, no prompt is longer
    than the context the warm-up chose from n_ctx (it must fit the KV cells)."""
    from tandem.workers.profiler import warm_up

    backend = FakeBackend(n_ctx=8192)
    backend.is_eog = lambda token: False
    prompts: dict[str, int] = {}
    run = backend.run

    def spy(decode, prefill):
        prompts.update((r.id, len(r.prompt)) for r, _ in prefill if r.id != "warm-prefill")
        return run(decode, prefill)

    backend.run = spy
    warm = warm_up(backend, max_active=64, step_tokens=64, compile_pass=False)
    assert warm.context < 64 and len(prompts) == sum((1, 2, 4, 8, 16, 32, 64))
    assert max(prompts.values()) <= warm.context
    assert not backend.kv


def test_a_worker_without_profile_or_rate_flags_says_its_rates_are_a_guess(
    tmp_path, monkeypatch, caplog
) -> None:
    from tandem.workers.config import WorkerConfig
    from tandem.workers.rates import rates

    monkeypatch.setenv("TANDEM_CACHE_DIR", str(tmp_path))  # no stored profiles here
    with caplog.at_level("WARNING", logger="tandem.workers.rates"):
        assert rates(WorkerConfig(router="tcp://127.0.0.1:1"), FakeBackend()) == (200.0, [50.0] * 4)
    assert "no stored profile for fake" in caplog.text and "tandem profile" in caplog.text
    caplog.clear()
    flagged = WorkerConfig(router="tcp://127.0.0.1:1", prefill_tok_s=900.0, decode_tok_s=(80.0,))
    with caplog.at_level("WARNING", logger="tandem.workers.rates"):
        assert rates(flagged, FakeBackend()) == (900.0, [80.0] * 4)
    assert not caplog.text


def test_a_worker_whose_stored_profile_has_a_stall_in_it_says_so(
    tmp_path, monkeypatch, caplog
) -> None:
    from tandem.workers.config import WorkerConfig
    from tandem.workers.profiles import save_profile
    from tandem.workers.rates import rates

    monkeypatch.setenv("TANDEM_CACHE_DIR", str(tmp_path))
    be = FakeBackend()

    def store(decode: list[float]) -> None:
        save_profile(
            be.name, be.device, be.model_name, {"prefill_tok_s": 1.0, "decode_tok_s": decode}
        )

    store([180.0, 11.0, 332.0, 560.0])
    with caplog.at_level("WARNING", logger="tandem.workers.rates"):
        assert rates(WorkerConfig(router="tcp://127.0.0.1:1"), be)[1] == [180.0, 11.0, 332.0, 560.0]
    assert "decode rates from the stored profile look wrong: batch 2: 11 tok/s" in caplog.text
    caplog.clear()
    store([180.0, 259.0, 332.0, 560.0])
    with caplog.at_level("WARNING", logger="tandem.workers.rates"):
        rates(WorkerConfig(router="tcp://127.0.0.1:1"), be)
    assert not caplog.text


def test_step_times_reach_the_heartbeat_as_a_step_model():
    e, b, _ = make(max_active=2, step_tokens=8)
    now = [100.0]
    e.timer.clock = lambda: now[0]  # the device's time, advanced by the fake backend below
    run = b.run

    def timed(decode, prefill):
        now[0] += 0.010 + 0.002 * len(decode) + 0.0005 * sum(n for _, n in prefill)
        return run(decode, prefill)

    b.run = timed
    e.submit(req("a", n=6, max_tokens=20))
    e.submit(req("b", n=6, max_tokens=20, start=50))
    run_all(e)
    # Steps: prefill 6+2 (a then decodes), a decodes + b prefills 4, then both decode.
    m = StepModel.from_wire(e.heartbeat().steps)
    assert m.decode_batch == (1, 2) and m.decode_samples[1] >= 17
    assert m.decode_step_s == pytest.approx((0.012, 0.014))
    assert m.prefill_chunk == (8,) and m.prefill_tok_s == pytest.approx((8 / 0.014,))
    assert e.heartbeat().steps is None  # unchanged: not sent again
    e.handle(p.ResyncCache())  # what a Welcome queues: a new router must learn it again
    assert StepModel.from_wire(e.heartbeat().steps) == m


def test_idle_time_between_requests_is_not_a_step():
    e, b, _ = make(max_active=1)
    now = [0.0]
    e.timer.clock = lambda: now[0]
    run = b.run

    def timed(decode, prefill):
        now[0] += 0.01
        return run(decode, prefill)

    b.run = timed
    e.submit(req("a", n=2, max_tokens=3))
    run_all(e)
    now[0] += 60.0  # the worker sat idle for a minute
    e.submit(req("b", n=2, max_tokens=3))
    run_all(e)
    steps = [s for w in e.timer.stats.decode.values() for s, _ in w.samples]
    assert max(steps) == pytest.approx(0.01)


def test_admitting_and_finishing_a_request_are_not_priced_as_decode_steps():
    """Restoring a cached prefix (begin) and storing KV (end, cache insert) cost one
    request, not a step: a burst's arrivals and departures must not make the decode
    steps they fall between look slower (the H200's served batch 2 looked 2x slow)."""
    e, b, _ = make(max_active=4, step_tokens=64)
    now = [0.0]
    e.timer.clock = lambda: now[0]
    run, begin, end = b.run, b.begin, b.end

    def timed(decode, prefill):
        now[0] += 0.010 * max(1, len(decode))  # a decode step: 10 ms a row
        return run(decode, prefill)

    def slow(fn):
        def wrapped(*args):
            now[0] += 0.050  # 50 ms of per-request work, 5x a batch-1 step
            return fn(*args)

        return wrapped

    b.run, b.begin, b.end = timed, slow(begin), slow(end)
    for i in range(4):  # staggered lengths: requests finish while others decode
        e.submit(req(f"r{i}", n=4, max_tokens=4 + 3 * i, start=10 * i + 1))
    run_all(e)
    decode = {k: [s for s, _ in w.samples] for k, w in e.timer.stats.decode.items()}
    assert set(decode) >= {1, 2, 3}
    for batch, steps in decode.items():
        assert max(steps) == pytest.approx(0.010 * batch), (batch, steps)
    assert e.timer.request_s == pytest.approx(8 * 0.050)  # 4 admits + 4 finishes


def test_a_new_batch_size_is_reported_at_once_repeats_wait():
    e, b, out = make(max_active=2, step_tokens=8)
    e.timer.clock = lambda: 0.0 if not b.steps else len(b.steps) * 0.01  # 10 ms a step
    e.submit(req("a", n=2, max_tokens=6))
    run_all(e)
    first = StepModel.from_wire(e.heartbeat().steps)
    assert first.decode_batch == (1,)
    e.submit(req("b", n=2, max_tokens=6))
    run_all(e)
    assert e.heartbeat().steps is None  # more of the same within steps_every_s: wait
    e.submit(req("c", n=2, max_tokens=6))
    e.submit(req("d", n=2, max_tokens=6, start=50))
    run_all(e)
    out.clear()
    e._changed, e._last_hb = False, time.monotonic()  # nothing else to report
    e.maybe_heartbeat()  # the new size alone triggers it
    (hb,) = [m for m in out if isinstance(m, p.Heartbeat)]
    assert StepModel.from_wire(hb.steps).decode_batch == (1, 2)


def test_a_heartbeat_with_nothing_new_repeats_the_last_one_byte_for_byte():
    e, _, _ = make()
    e.heartbeat()  # the first lists the whole (empty) cache; later ones report changes
    first = e.heartbeat()
    again = e.heartbeat()  # idle, nothing changed: the same seq, the same frame
    assert again.seq == first.seq and p.encode(again) == p.encode(first)
    e.submit(req("a", n=4, max_tokens=2))
    queued = e.heartbeat()  # something changed: a new seq
    assert queued.seq == first.seq + 1 and len(queued.queued) == 1
    run_all(e)
    after = e.heartbeat()  # finished: the cache report (and the step model) changed
    assert after.seq == queued.seq + 1
    settled = e.heartbeat()  # the step model is sent once, then no longer
    assert e.heartbeat() == settled  # idle again: the same heartbeat
