"""The workers' sampling pieces without a model: logprobs arithmetic, MLX logits
processing against the formulas, and a worker refusing what it cannot serve."""

from __future__ import annotations

import numpy as np
import pytest

from tandem.common import protocol as p
from tandem.common.protocol import SamplingParams
from tandem.workers.engine import Engine, EngineConfig
from tandem.workers.request import Request, TokenLogprobs, sampling_problem, wire_logprob
from tests.helpers import FakeBackend


# ---------------------------------------------------------------- the worker's door
def test_a_worker_refuses_what_its_backend_does_not_advertise() -> None:
    backend = FakeBackend()  # advertises nothing, as the sim backend
    req = Request("r", [1, 2], SamplingParams(logprobs=2, presence_penalty=1.0))
    problem = sampling_problem(req, backend)
    assert problem is not None and problem.code == p.BAD_REQUEST
    assert "logprobs" in problem.message and "penalties" in problem.message
    backend.capabilities = ("logprobs", "penalties")
    assert sampling_problem(req, backend) is None


def test_a_logit_bias_outside_the_vocabulary_is_refused() -> None:
    backend = FakeBackend()
    backend.capabilities = ("logit_bias",)
    req = Request("r", [1], SamplingParams(logit_bias={backend.vocab_size: 1.0}))
    assert "vocabulary" in sampling_problem(req, backend).message


def test_the_engine_answers_such_a_request_with_an_error_not_tokens() -> None:
    out: list[p.Message] = []
    engine = Engine(FakeBackend(), EngineConfig(), out.append, "w")
    engine.submit(Request("r", [1, 2], SamplingParams(json_schema='{"type": "object"}')))
    assert [type(m) for m in out] == [p.Error] and "json_schema" in out[0].message
    assert not engine.queue


def test_wire_logprob_names_each_token_s_text() -> None:
    pieces = {1: b"a", 2: b"\xe2\x82", 3: b"c"}
    entry = wire_logprob(2, TokenLogprobs(-0.5, [1, 3], [-0.1, -2.0]), pieces.__getitem__)
    assert entry.id == 2 and entry.logprob == -0.5
    assert entry.token == "\ufffd"  # half a character: replaced, never an exception
    assert [tuple(t) for t in entry.top] == [(1, "a", -0.1), (3, "c", -2.0)]


# ---------------------------------------------------------------- llama.cpp's logprobs
def test_llama_token_logprobs_are_a_log_softmax_with_its_top_n() -> None:
    ls = pytest.importorskip("tandem.workers.backends.llama_sampling")
    logits = np.array([1.0, 3.0, 3.0, -2.0, 0.5], dtype=np.float32)
    want = logits - np.log(np.sum(np.exp(logits)))
    lp = ls.token_logprobs(logits, 4, 3)
    assert lp.logprob == pytest.approx(want[4], abs=1e-6)
    assert lp.top_ids == [1, 2, 0]  # likeliest first, a tie by id
    assert lp.top_logprobs == pytest.approx(want[[1, 2, 0]].tolist(), abs=1e-6)
    assert ls.token_logprobs(logits, 0, 0).top_ids == []
    assert len(ls.token_logprobs(logits, 0, 20).top_ids) == 5  # fewer only if the vocab is


def test_llama_top_n_equals_a_full_sort() -> None:
    """The block-maxima shortcut picks what sorting everything picks, ties included."""
    ls = pytest.importorskip("tandem.workers.backends.llama_sampling")
    rng = np.random.default_rng(1)
    for trial in range(200):
        size, n = int(rng.integers(1, 2000)), int(rng.integers(0, 25))
        x = rng.normal(size=size).astype(np.float32)
        if trial % 3 == 0:
            x = np.round(x, 1)  # many ties
        if trial % 5 == 0:
            x[rng.integers(0, size, size=size // 2)] = -np.inf  # banned tokens
        want = np.lexsort((np.arange(size), -x))[: min(n, size)]
        assert ls.top_n(x, n).tolist() == want.tolist(), (size, n)


def test_llama_seeds_avoid_llama_cpp_s_random_seed_sentinel() -> None:
    ls = pytest.importorskip("tandem.workers.backends.llama_sampling")
    assert ls.dist_seed(7) == 7
    assert ls.dist_seed(0xFFFFFFFF) != 0xFFFFFFFF  # would mean "pick one at random"
    assert 0 <= ls.dist_seed(2**64 - 1) < 0xFFFFFFFF
    assert ls.dist_seed(None) != 0xFFFFFFFF


# ---------------------------------------------------------------- MLX processing
def _mlx():
    mx = pytest.importorskip("mlx.core")
    from tandem.workers.backends.mlx import logits as lg

    return mx, lg


def test_mlx_processing_follows_the_formulas_on_the_rows_that_ask() -> None:
    mx, lg = _mlx()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 50)).astype(np.float32) * 3
    s = SamplingParams(repetition_penalty=1.7, presence_penalty=0.6, frequency_penalty=0.4,
                       logit_bias={5: 2.0, 9: -100.0})  # fmt: skip
    proc = lg.Processing.create(s, 50)
    prompt = [1, 2, 2, 3]
    hist = lg.History.create(proc, prompt + [7, 7, 8], 3, 50)  # 7, 7, 8 were sent before
    got = np.array(lg.process(mx.array(x), [(1, proc, hist)]))
    want = x[1].copy()
    want[5] += 2.0
    want[9] -= 100.0
    for t in {1, 2, 3, 7, 8}:  # repetition: prompt and output
        want[t] = want[t] * 1.7 if want[t] <= 0 else want[t] / 1.7
    want[7] -= 2 * 0.4 + 0.6  # presence and frequency: output only
    want[8] -= 1 * 0.4 + 0.6
    np.testing.assert_allclose(got[1], want, rtol=1e-6)
    np.testing.assert_array_equal(got[[0, 2]], x[[0, 2]])  # rows not listed: untouched


def test_mlx_history_counts_each_produced_token() -> None:
    mx, lg = _mlx()
    proc = lg.Processing.create(SamplingParams(frequency_penalty=1.0), 10)
    h = lg.History.create(proc, [4, 4], 0, 10)
    assert h.seen is None and np.array(h.output).sum() == 0  # the prompt is not output
    h2 = h.after(mx.array(3)).after(mx.array(3))
    assert np.array(h2.output)[3] == 2 and np.array(h.output)[3] == 0  # a value: h unchanged


def test_mlx_asks_for_nothing_when_the_request_does_not() -> None:
    _, lg = _mlx()
    assert lg.Processing.create(SamplingParams(), 10) is None
    only = lg.Processing.create(SamplingParams(logprobs=0), 10)
    assert only is not None and not only.changes_logits


def test_mlx_row_logprobs_follow_rows_that_leave() -> None:
    mx, lg = _mlx()
    x = mx.array(np.log(np.array([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8], [0.6, 0.2, 0.2]])))
    lps = lg.logprobs(x.astype(mx.float32), mx.array([1, 2, 0]), [(0, 2), (2, 1)])
    assert np.array(lps.chosen).tolist() == pytest.approx(np.log([0.3, 0.6]).tolist(), abs=1e-6)
    assert np.array(lps.top_ids).tolist() == [[0, 1], [0, 1]]  # n: the most any row asked
    kept = lps.select([1, 2])  # row 0 left; rows 1 and 2 are now 0 and 1
    assert kept.rows == [1] and kept.wanted == [1]
    assert np.array(kept.chosen).tolist() == pytest.approx([np.log(0.6)], abs=1e-6)
    assert lps.select([1]) is None


# ---------------------------------------------------------------- to the wire
def test_logprobs_cross_the_io_thread_aligned_in_one_step_frame() -> None:
    """Deltas with and without logprobs coalesce into one StepTokens whose entry i
    belongs to request i; a frame where nobody asked carries none."""
    import msgpack

    from tandem.workers.frames import delta_fields, token_frame

    lp = p.TokenLogprob(id=5, token="a", logprob=-0.25, top=[(5, "a", -0.25), (6, "b", -1.5)])
    sent = [p.TokenDelta("r1", [5], "a", logprobs=[lp]), p.TokenDelta("r2", [9], "z")]
    through = [msgpack.unpackb(msgpack.packb(delta_fields(d))) for d in sent]
    frame = token_frame(through)
    assert isinstance(frame, p.StepTokens) and frame.logprobs == [[lp], None]
    assert frame.deltas() == sent
    assert p.decode(p.encode(frame)) == frame  # valid on the wire
    plain = token_frame([through[1], through[1]])
    assert plain.logprobs is None
    assert token_frame(through[:1]) == sent[0]
