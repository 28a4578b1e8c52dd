"""The MLX worker's sampling fields against mlx-lm's own logits processors and
samplers, on the tiny float32 llama of test_mlx_backend.py (CPU).

mlx-lm's ``generate_step`` feeds its processors prompt and output; OpenAI's presence
and frequency penalties count only the output, so the reference hands those two the
output part (its windows made larger than any run here).
"""

from __future__ import annotations

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")

from mlx_lm.generate import generate_step  # noqa: E402
from mlx_lm.sample_utils import (  # noqa: E402
    apply_min_p,
    apply_top_k,
    make_logits_processors,
)

from tandem.common import protocol as p  # noqa: E402
from tandem.common.protocol import SamplingParams  # noqa: E402
from tandem.workers.backends.mlx.sampling import truncated  # noqa: E402
from tandem.workers.request import Request  # noqa: E402
from tests.parity import test_mlx_backend as base  # noqa: E402
from tests.parity.test_mlx_backend import Harness, prompts  # noqa: E402

pytestmark = pytest.mark.mlx
tiny = base.tiny  # the tiny llama with an untied random head, shared


@pytest.fixture(scope="module")
def tied():
    """The tiny llama with its head tied: it mostly repeats the token it was fed, so
    penalties on repeated tokens change what it says."""
    from tandem.workers.backends.mlx.model import make_tiny_model

    return make_tiny_model(seed=1)


N = 12
WIDE = 10_000  # mlx-lm's penalty windows, wider than prompt + output


def reference(model, prompt: list[int], n: int = N, **kw) -> tuple[list[int], list[mx.array]]:
    """mlx-lm's greedy loop with its processors: tokens and per-step logprobs."""
    processors = make_logits_processors(
        kw.get("logit_bias"), kw.get("repetition_penalty"), WIDE
    )  # bias first, then repetition over prompt + output, as ours
    output_only = make_logits_processors(
        None, None, None, kw.get("presence_penalty"), WIDE, kw.get("frequency_penalty"), WIDE
    )
    processors += [_on_output(proc, len(prompt)) for proc in output_only]
    steps = generate_step(mx.array(prompt), model, max_tokens=n, logits_processors=processors)
    out = [(int(t), lp) for t, lp in steps]
    return [t for t, _ in out], [lp for _, lp in out]


def _on_output(proc, n_prompt: int):
    return lambda tokens, logits: proc(tokens[n_prompt:], logits)


def ours(tiny, prompt: list[int], n: int = N, **kw) -> tuple[list[int], Harness]:
    h = Harness(tiny)
    req = Request("r", list(prompt), SamplingParams(max_tokens=n, ignore_eos=True, **kw))
    return h.run(req)["r"], h


CASES = [
    {"presence_penalty": 4.0},
    {"frequency_penalty": 0.7},
    {"presence_penalty": 0.5, "frequency_penalty": 0.5},
    {"repetition_penalty": 1.8},
    {"logit_bias": {7: 5.0, 300: 3.0, 1000: -100.0}},
    {"repetition_penalty": 1.3, "presence_penalty": 1.0, "logit_bias": {42: 4.0}},
]


@pytest.mark.parametrize("kw", CASES, ids=lambda kw: "+".join(kw))
def test_processing_matches_mlx_lm_and_changes_the_output(tied, kw) -> None:
    prompt = prompts()[1]
    got, _ = ours(tied, prompt, **kw)
    want, _ = reference(tied[0], prompt, **kw)
    assert got == want
    assert got != ours(tied, prompt)[0]


def test_penalised_rows_beside_plain_rows_in_one_batch(tiny) -> None:
    """Only the rows that ask are processed; each as it would be alone."""
    ps = prompts()
    kws = [{"presence_penalty": 1.5}, {}, {"repetition_penalty": 1.8}, {"logprobs": 2}]
    h = Harness(tiny)
    reqs = [
        Request(f"r{i}", prompt, SamplingParams(max_tokens=N, ignore_eos=True, **kw))
        for i, (prompt, kw) in enumerate(zip(ps, kws, strict=True))
    ]
    batched = h.run(*reqs)
    for i, (prompt, kw) in enumerate(zip(ps, kws, strict=True)):
        assert batched[f"r{i}"] == reference(tiny[0], prompt, **kw)[0], kw
    h.assert_released()


def test_logprobs_equal_mlx_lm_s(tiny) -> None:
    """After the bias, before temperature: mlx-lm's generate_step logprobs."""
    prompt = prompts()[0]
    bias = {11: 2.0}
    _, h = ours(tiny, prompt, logprobs=4, logit_bias=bias)
    want_tokens, want = reference(tiny[0], prompt, logit_bias=bias)
    deltas = [m for m in h.messages if getattr(m, "logprobs", None)]
    assert [d.token_ids[0] for d in deltas] == want_tokens
    for d, lp in zip(deltas, want, strict=True):
        (e,) = d.logprobs
        ref = np.array(lp.astype(mx.float32))
        assert e.logprob == pytest.approx(float(ref[e.id]), abs=1e-4)
        top = np.argsort(-ref, kind="stable")[:4]
        assert [t for t, _, _ in e.top] == top.tolist()
        assert [v for _, _, v in e.top] == pytest.approx(ref[top].tolist(), abs=1e-4)


def test_logprobs_through_the_speculative_pipeline_and_rows_leaving(tiny) -> None:
    """Rows leave the batch at different steps while the next step is queued: each
    token still gets its own logprobs, aligned with its id."""
    ps = prompts()
    h = Harness(tiny)
    reqs = [
        Request(f"r{i}", prompt, SamplingParams(max_tokens=m, ignore_eos=True, logprobs=1))
        for i, (prompt, m) in enumerate(zip(ps, (4, 9, 6, 12), strict=True))
    ]
    h.run(*reqs)
    for r in reqs:
        _, want = reference(tiny[0], r.prompt, n=r.max_tokens)
        deltas = [m for m in h.messages if isinstance(m, p.TokenDelta) and m.request_id == r.id]
        assert len(deltas) == r.max_tokens
        for d, lp in zip(deltas, want, strict=True):
            assert d.logprobs[0].id == d.token_ids[0]
            assert d.logprobs[0].logprob == pytest.approx(float(lp[d.token_ids[0]]), abs=1e-4)


@pytest.mark.parametrize("min_p", [0.05, 0.3, 0.9])
def test_min_p_keeps_what_mlx_lm_keeps(min_p: float) -> None:
    logits = mx.random.normal((5000,), key=mx.random.key(3)) * 3
    logprobs = logits - mx.logsumexp(logits)
    order, xs = truncated(logits, 0, 1.0, min_p)
    ours = set(np.array(order)[np.isfinite(np.array(xs))].tolist())
    theirs = set(np.flatnonzero(np.isfinite(np.array(apply_min_p(logprobs[None], min_p)[0]))))
    assert ours == theirs
    assert 0 < len(ours) < 5000


def test_top_k_then_min_p_keeps_what_mlx_lm_keeps() -> None:
    logits = mx.random.normal((3000,), key=mx.random.key(4))
    order, xs = truncated(logits, 50, 1.0, 0.5)
    ours = set(np.array(order)[np.isfinite(np.array(xs))].tolist())
    lp = logits - mx.logsumexp(logits)
    both = apply_min_p(apply_top_k(lp[None], 50), 0.5)[0]
    assert ours == set(np.flatnonzero(np.isfinite(np.array(both))).tolist())


def test_min_p_with_a_seed_samples_only_kept_tokens(tiny) -> None:
    prompt = prompts()[2]
    got, _ = ours(tiny, prompt, temperature=1.5, min_p=0.5, seed=3)
    again, _ = ours(tiny, prompt, temperature=1.5, min_p=0.5, seed=3)
    assert got == again
    assert got != ours(tiny, prompt, temperature=1.5, seed=3)[0]


BOUNDED = {  # every value bounded, so even a random model must close the object
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "n": {"type": "integer", "minimum": 0, "maximum": 9},
        "tag": {"enum": ["red", "green"]},
        "note": {"type": "string", "maxLength": 4},
    },
    "required": ["ok", "n", "tag", "note"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_json_schema_output_parses_and_validates_beside_a_plain_row(tiny, temperature) -> None:
    """llguidance's mask on the constrained row; the plain row in the same batch
    decodes as it does alone (the batch stops queueing steps ahead, nothing else)."""
    pytest.importorskip("llguidance")
    jsonschema = pytest.importorskip("jsonschema")
    import json

    ps = prompts()
    h = Harness(tiny)
    schema = SamplingParams(max_tokens=60, temperature=temperature, seed=2,
                            json_schema=json.dumps(BOUNDED))  # fmt: skip
    plain = SamplingParams(max_tokens=N, ignore_eos=True)
    h.run(Request("j", ps[0], schema), Request("p", ps[1], plain))
    jsonschema.validate(json.loads(h.text("j")), BOUNDED)
    assert h.done("j").finish_reason == "eos"  # the object closed, then only EOS was allowed
    assert h.tokens({"p"})["p"] == ours(tiny, ps[1])[0]
    h.assert_released()


def test_a_schema_llguidance_cannot_take_is_refused_on_arrival(tiny) -> None:
    pytest.importorskip("llguidance")
    h = Harness(tiny)
    h.engine.submit(Request("x", prompts()[0], SamplingParams(json_schema='{"type": "nope"}')))
    (err,) = [m for m in h.messages if isinstance(m, p.Error)]
    assert err.code == p.BAD_REQUEST and "json_schema" in err.message
    assert not h.engine.queue
