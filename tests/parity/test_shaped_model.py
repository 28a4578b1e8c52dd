"""Random-weight models shaped like real ones (studies/models/shaped_model.py): for timing runs
where the real weights cannot be had. Both workers must load them and tokenize as the
default model does."""

from __future__ import annotations

from pathlib import Path

import pytest

from studies.models.shaped_model import SHAPES, q8_0_random, write_shaped_model
from tandem.common import protocol as p
from tandem.common.model_files import default_model_path
from tandem.common.protocol import SamplingParams
from tandem.common.tokenizer import TextTokenizer, tokenizer_spec_from_gguf
from tandem.workers.engine import Engine, EngineConfig
from tandem.workers.request import Request
from tests.helpers import needs_llama

pytestmark = pytest.mark.model
TEXT = "The three primary colors are red, yellow and blue. 123 ünïcödé"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_shaped_model(SHAPES["tiny"], tmp_path_factory.mktemp("shaped") / "tiny.gguf")


def greedy(backend, prompt: list[int], n: int) -> list[int]:
    out: list[p.Message] = []
    engine = Engine(backend, EngineConfig(max_active=2, step_tokens=64), out.append, "t")
    engine.submit(Request("r", prompt, SamplingParams(max_tokens=n, ignore_eos=True)))
    while engine.queue or engine.active:
        engine.step()
    return [t for m in out if isinstance(m, p.TokenDelta) for t in m.token_ids]


def test_q8_0_blocks_have_the_gguf_layout() -> None:
    import numpy as np
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    raw = q8_0_random(3, 64, np.random.default_rng(0), 0.02)
    assert raw.shape == (3, 2 * 34)
    w = dequantize(raw, GGMLQuantizationType.Q8_0)
    assert w.shape == (3, 64) and 0.01 < float(w.std()) < 0.03


def test_a_shaped_model_keeps_the_default_tokenizer_padded_to_its_vocabulary(tiny) -> None:
    spec = tokenizer_spec_from_gguf(tiny)
    default = TextTokenizer(tokenizer_spec_from_gguf(default_model_path()))
    assert TextTokenizer(spec).encode(TEXT) == default.encode(TEXT)
    assert spec.eos_ids == tokenizer_spec_from_gguf(default_model_path()).eos_ids


@needs_llama
def test_both_backends_load_it_and_agree_on_greedy_tokens(tiny) -> None:
    pytest.importorskip("mlx_lm")
    from tandem.workers.backends.llama import LlamaBackend
    from tandem.workers.backends.mlx.backend import MlxBackend

    prompt = TextTokenizer(tokenizer_spec_from_gguf(tiny)).encode(TEXT)
    cpp = LlamaBackend(tiny, n_ctx=512, threads=1, max_active=2, cache_entries=2, step_tokens=64,
                       device="cpu")  # fmt: skip
    mlx = MlxBackend(tiny, n_ctx=512, device="cpu")
    assert cpp.vocab_size == mlx.vocab_size == SHAPES["tiny"].vocab
    ours = greedy(cpp, prompt, 12)
    assert len(ours) == 12 and ours == greedy(mlx, prompt, 12)
