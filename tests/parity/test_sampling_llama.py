"""The llama.cpp worker's sampling fields against raw llama-cpp-python on the embedded
model: penalties, logit_bias, min_p and logprobs give what the library's high-level
``Llama`` gives with the same settings; json_schema output parses and validates.

Both sides run the same numerics (one 128-token micro-batch, flash attention on as
the worker's context has it), so greedy tokens agree exactly. Each test also checks
that its setting changed the output, so a field that was silently ignored fails.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import numpy as np
import pytest

from tandem.common import protocol as p
from tandem.common.model_files import default_model_path
from tandem.common.protocol import SamplingParams
from tandem.common.tokenizer import TextTokenizer, tokenizer_spec_from_gguf
from tandem.workers.engine import Engine, EngineConfig
from tandem.workers.request import Request
from tests.helpers import needs_llama

pytestmark = [pytest.mark.model, needs_llama]
STEP = 128
CHAT = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
N = 24
LLAMA_BACKEND = {"n_ctx": 1024, "cache_entries": 2, "step_tokens": STEP}  # conftest's backend


@pytest.fixture(scope="module")
def ref():
    """The raw library, set up to compute as the worker does."""
    from llama_cpp import Llama

    return Llama(str(default_model_path()), n_ctx=1024, n_batch=STEP, n_ubatch=STEP,
                 n_threads=2, flash_attn=True, logits_all=True, verbose=False)  # fmt: skip


@pytest.fixture(scope="module")
def prompt() -> list[int]:
    tok = TextTokenizer(tokenizer_spec_from_gguf(default_model_path()))
    return tok.encode(CHAT.format("Give me a JSON object describing a cat with name and age."))


class Run:
    """One engine over the shared backend; ``go`` runs requests to the end."""

    def __init__(self, backend: Any) -> None:
        self.messages: list[p.Message] = []
        cfg = EngineConfig(max_active=4, step_tokens=STEP, cache_tokens=0)  # no cache: seqs freed
        self.engine = Engine(backend, cfg, self.messages.append, "t")

    def go(self, *reqs: Request) -> Run:
        for r in reqs:
            self.engine.submit(r)
        while self.engine.queue or self.engine.active:
            self.engine.step()
        return self

    def deltas(self, rid: str) -> list[p.TokenDelta]:
        return [m for m in self.messages if isinstance(m, p.TokenDelta) and m.request_id == rid]

    def tokens(self, rid: str) -> list[int]:
        return [t for m in self.deltas(rid) for t in m.token_ids]

    def text(self, rid: str) -> str:
        return "".join(m.text for m in self.deltas(rid))

    def errors(self) -> list[p.Error]:
        return [m for m in self.messages if isinstance(m, p.Error)]


def ours(backend: Any, prompt: list[int], **sampling: Any) -> list[int]:
    req = Request("r", prompt, SamplingParams(**{"max_tokens": N, **sampling}))
    return Run(backend).go(req).tokens("r")


def theirs(ref: Any, prompt: list[int], seed: int = 0, **kw: Any) -> list[int]:
    """llama-cpp-python's generate loop, stopped at end-of-generation or N tokens."""
    ref.set_seed(seed)
    settings = {"temp": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, **kw}
    out: list[int] = []
    for t in ref.generate(prompt, reset=True, **settings):
        if t == ref.token_eos() or len(out) == N:
            break
        out.append(t)
    return out


def test_greedy_matches_the_library(backend, ref, prompt) -> None:
    assert ours(backend, prompt) == theirs(ref, prompt)


def steps(backend: Any, prompt: list[int], **sampling: Any) -> tuple[list[int], list[dict]]:
    """Greedy tokens and, per step, the logprobs the sampler saw: the chosen token's and
    the 20 likeliest, by token id."""
    req = Request("r", prompt, SamplingParams(**{"max_tokens": N, "logprobs": 20, **sampling}))
    run = Run(backend).go(req)
    seen = [lp for m in run.deltas("r") for lp in m.logprobs or ()]
    return run.tokens("r"), [{i: x for i, _, x in lp.top} | {lp.id: lp.logprob} for lp in seen]


def test_presence_and_frequency_penalties_match_the_library(backend, ref, prompt) -> None:
    """The library's penalty window (last_n_tokens_size, 64) covers all N outputs and
    it feeds its penalties no prompt: OpenAI's semantics, ours.

    That the penalties reach the sampler is checked on its logprobs, not on whether
    they change this prompt's greedy tokens (on some builds' numerics they do not).
    While both runs have produced the same tokens, the unpenalized logits are the
    same, so between two tokens the penalized logprobs differ from the plain ones by
    exactly the penalties: ``freq * count + pres`` for a token already output."""
    plain_tokens, plain = steps(backend, prompt)
    for pres, freq in [(1.5, 0.5), (0.0, 2.0)]:
        got, seen = steps(backend, prompt, presence_penalty=pres, frequency_penalty=freq)
        assert got == theirs(ref, prompt, presence_penalty=pres, frequency_penalty=freq)
        checked = 0
        for i, (a, b) in enumerate(zip(plain, seen, strict=False)):
            counts = Counter(got[:i])  # the output so far, the same in both runs
            common = sorted(set(a) & set(b))
            fresh = [t for t in common if not counts[t]]  # no penalty: the reference
            for t in common if fresh else ():
                want = -(freq * counts[t] + pres * (counts[t] > 0))
                shift = (b[t] - b[fresh[0]]) - (a[t] - a[fresh[0]])
                assert shift == pytest.approx(want, abs=1e-3), (pres, freq, i, t)
                checked += bool(counts[t])
            if got[i : i + 1] != plain_tokens[i : i + 1]:  # the contexts part: no more to compare
                break
        # An effect seen: a penalized token's shift measured, or the output changed.
        assert checked or got != plain_tokens, "no step showed what the penalties did"


def test_repetition_penalty_covers_the_prompt_as_hf_does(backend, ref, prompt) -> None:
    """The reference: the library's loop with an HF-style processor over its input ids
    (prompt and output); its own repeat_penalty sees only the output."""
    from llama_cpp import LogitsProcessorList

    def hf_repetition(input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        ids = np.unique(np.asarray(input_ids))
        s = scores[ids]
        scores[ids] = np.where(s <= 0, s * 1.5, s / 1.5)
        return scores

    got = ours(backend, prompt, repetition_penalty=1.5)
    processors = LogitsProcessorList([hf_repetition])
    assert got == theirs(ref, prompt, logits_processor=processors)
    assert got != ours(backend, prompt)


def test_logit_bias_matches_the_library(backend, ref, prompt) -> None:
    plain = ours(backend, prompt)
    bias = {plain[0]: -100.0, plain[1]: -5.0, 1464: 3.0}
    got = ours(backend, prompt, logit_bias=bias)
    want = ref.create_completion(prompt, max_tokens=N, temperature=0.0, top_k=0, top_p=1.0,
                                 min_p=0.0, logit_bias=bias)  # fmt: skip
    assert got[0] != plain[0]
    text = Run(backend).go(Request("b", prompt, SamplingParams(max_tokens=N, logit_bias=bias)))
    assert text.text("b") == want["choices"][0]["text"]


def test_min_p_with_a_seed_matches_the_library(backend, ref, prompt) -> None:
    """Same seed, same chain (min-p before temperature, then the seeded draw): the
    same tokens; and min-p changes what the seed alone gives."""
    got = ours(backend, prompt, temperature=1.5, min_p=0.2, seed=123)
    assert got == theirs(ref, prompt, seed=123, temp=1.5, min_p=0.2)
    assert got != ours(backend, prompt, temperature=1.5, seed=123)


def test_logprobs_equal_the_library_s(backend, ref, prompt) -> None:
    run = Run(backend).go(Request("l", prompt, SamplingParams(max_tokens=8, logprobs=5)))
    deltas = run.deltas("l")
    want = ref.create_completion(prompt, max_tokens=8, temperature=0.0, top_k=0, top_p=1.0,
                                 min_p=0.0, logprobs=5)["choices"][0]["logprobs"]  # fmt: skip
    assert len(deltas) == len(want["token_logprobs"]) == 8
    for d, lp, top in zip(deltas, want["token_logprobs"], want["top_logprobs"], strict=True):
        (entry,) = d.logprobs
        assert entry.id == d.token_ids[0]
        assert entry.logprob == pytest.approx(float(lp), abs=1e-4)
        assert len(entry.top) == 5
        assert [v for _, _, v in entry.top] == sorted((v for _, _, v in entry.top), reverse=True)
        ref_top = sorted((float(v) for v in top.values()), reverse=True)[:5]
        assert [v for _, _, v in entry.top] == pytest.approx(ref_top, abs=1e-4)
        assert entry.top[0][0] == entry.id  # greedy: the chosen token is the likeliest


def test_logprobs_see_the_bias_and_not_the_temperature(backend, prompt) -> None:
    """After logit_bias, before temperature (docs/PROTOCOL.md)."""
    plain = Run(backend).go(Request("a", prompt, SamplingParams(max_tokens=1, logprobs=3)))
    (e,) = plain.deltas("a")[0].logprobs
    runner = e.top[1][0]
    biased = Run(backend).go(
        Request("b", prompt, SamplingParams(max_tokens=1, logprobs=3, logit_bias={runner: 2.0})),
        Request("c", prompt, SamplingParams(max_tokens=1, logprobs=3, temperature=5.0, seed=1)),
    )
    (b,) = biased.deltas("b")[0].logprobs
    assert dict((t, v) for t, _, v in b.top)[runner] > e.top[1][2]
    (c,) = biased.deltas("c")[0].logprobs
    assert [v for _, _, v in c.top] == pytest.approx([v for _, _, v in e.top], abs=1e-4)


def test_requests_that_ask_nothing_get_no_logprobs(backend, prompt) -> None:
    run = Run(backend).go(Request("n", prompt, SamplingParams(max_tokens=3)))
    assert all(d.logprobs is None for d in run.deltas("n"))


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer"},
        "indoor": {"type": "boolean"},
    },
    "required": ["name", "age", "indoor"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_json_schema_output_parses_and_validates(backend, prompt, temperature) -> None:
    """The model alone answers this prompt with a fenced Python block."""
    jsonschema = pytest.importorskip("jsonschema")
    sampling = SamplingParams(max_tokens=80, temperature=temperature, seed=5,
                              json_schema=json.dumps(SCHEMA))  # fmt: skip
    run = Run(backend).go(Request("j", prompt, sampling))
    done = [m for m in run.messages if isinstance(m, p.Done)]
    assert done and done[0].finish_reason == "eos"  # the grammar ended the object
    jsonschema.validate(json.loads(run.text("j")), SCHEMA)
    plain = Run(backend).go(Request("p", prompt, SamplingParams(max_tokens=4))).text("p")
    assert plain.startswith("```")  # unconstrained, a fenced block: the schema did this


def test_a_schema_llama_cpp_cannot_take_is_a_clear_400(backend, prompt) -> None:
    run = Run(backend).go(Request("x", prompt, SamplingParams(json_schema='{"type": "nope"}')))
    (err,) = run.errors()
    assert err.code == p.BAD_REQUEST and "json_schema" in err.message
    assert backend.free_seqs and not run.engine.active


def test_a_seeded_request_samples_the_same_alone_and_in_a_batch(prompt, fresh_backend) -> None:
    """Each request has its own seeded chain: the batch it shares does not move its
    random stream. Each run starts on a fresh context and the seeded request is
    admitted first, so its KV sits in the same cells as alone: llama.cpp's logits
    then agree, and only the random stream is under test (docs/USAGE.md says what a
    seed does not promise when the cells or chunks differ)."""
    tok = TextTokenizer(tokenizer_spec_from_gguf(default_model_path()))
    seeded = SamplingParams(max_tokens=24, temperature=1.0, seed=7)
    others = [tok.encode(t) for t in ("Once upon a time", "The capital of France is")]
    texts = []
    for batch in ([], others):
        backend = fresh_backend()
        # One call a step, as the cells-alike premise needs (rows split into calls of
        # their own attend over other spans: llama_rows.py; their own test covers them).
        backend.rows_per_call = None
        try:
            run = Run(backend).go(
                Request("s", prompt, seeded),
                *[
                    Request(f"o{i}", o, SamplingParams(max_tokens=24, temperature=1.0))
                    for i, o in enumerate(batch)
                ],  # fmt: skip
            )
        finally:
            backend.close()
        texts.append(run.text("s"))
        assert all(run.text(f"o{i}") for i in range(len(batch)))  # they did decode beside it
    assert texts[0] == texts[1]
    other_seed = SamplingParams(max_tokens=24, temperature=1.0, seed=8)
    backend = fresh_backend()
    try:
        assert Run(backend).go(Request("s", prompt, other_seed)).text("s") != texts[0]
    finally:
        backend.close()
