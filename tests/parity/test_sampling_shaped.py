"""The sampling fields on a shaped Qwen2 model (random weights, Qwen2's tokenizer and
layout: studies/models/shaped_model.py), on both backends, against the raw libraries: the
llama.cpp worker against llama-cpp-python's ``Llama``, the MLX worker (the same GGUF,
loaded by MLX) against mlx-lm's processors on its own model."""

from __future__ import annotations

from pathlib import Path

import pytest

from studies.models.shaped_model import SHAPES, write_shaped_model
from tandem.common.protocol import SamplingParams
from tandem.common.tokenizer import TextTokenizer, tokenizer_spec_from_gguf
from tandem.workers.request import Request
from tests.helpers import needs_llama
from tests.parity.test_sampling_llama import STEP, Run

pytestmark = [pytest.mark.model, needs_llama]
SETTINGS = {"presence_penalty": 1.5, "frequency_penalty": 1.0, "logit_bias": {15: 3.0}}
N = 16


def prompt(path: Path) -> list[int]:
    tok = TextTokenizer(tokenizer_spec_from_gguf(path))
    return tok.encode("The quick brown fox jumps over the lazy dog. The quick brown")


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_shaped_model(SHAPES["tiny-qwen2"], tmp_path_factory.mktemp("s") / "q.gguf")


def test_llama_cpp_worker_matches_the_library_on_qwen2(qwen2) -> None:
    from llama_cpp import Llama

    from tandem.workers.backends.llama import LlamaBackend

    backend = LlamaBackend(qwen2, n_ctx=512, threads=2, max_active=2, cache_entries=1,
                           step_tokens=STEP)  # fmt: skip
    try:
        sampling = SamplingParams(max_tokens=N, ignore_eos=True, **SETTINGS)
        got = Run(backend).go(Request("r", prompt(qwen2), sampling)).tokens("r")
        plain = SamplingParams(max_tokens=N, ignore_eos=True)
        alone = Run(backend).go(Request("p", prompt(qwen2), plain)).tokens("p")
    finally:
        backend.close()
    ref = Llama(str(qwen2), n_ctx=512, n_batch=STEP, n_ubatch=STEP, n_threads=2,
                flash_attn=True, verbose=False)  # fmt: skip
    want = ref.create_completion(prompt(qwen2), max_tokens=N, temperature=0.0, top_k=0, top_p=1.0,
                                 min_p=0.0, presence_penalty=1.5, frequency_penalty=1.0,
                                 logit_bias={15: 3.0})  # fmt: skip
    assert ref.detokenize(got).decode(errors="replace") == want["choices"][0]["text"]
    assert got != alone


def test_mlx_worker_matches_mlx_lm_on_qwen2(qwen2) -> None:
    mx = pytest.importorskip("mlx.core")
    pytest.importorskip("mlx_lm")
    from tandem.workers.backends.mlx.backend import MlxBackend
    from tests.parity.test_sampling_mlx import reference

    backend = MlxBackend(qwen2, n_ctx=512, device="cpu")
    sampling = SamplingParams(max_tokens=N, ignore_eos=True, logprobs=2, **SETTINGS)
    run = Run(backend).go(Request("r", prompt(qwen2), sampling))
    got = run.tokens("r")
    want, logprobs = reference(backend.model, prompt(qwen2), n=N, **SETTINGS)
    assert got == want
    for d, lp in zip(run.deltas("r"), logprobs, strict=True):
        ref = lp.astype(mx.float32)
        assert d.logprobs[0].logprob == pytest.approx(ref[d.token_ids[0]].item(), abs=1e-4)
