"""Every supported family on both backends: a shaped random-weight GGUF per architecture
(studies/models/shaped_model.py) with the family's tokenizer, checked against llama.cpp on the
same file: token ids, chat template, logits (top-1 and mean NLL within the bounds the
SmolLM2 parity test uses), and batched decode equal to each request alone."""

from __future__ import annotations

import ctypes
import random
from pathlib import Path

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")

from studies.models.shaped_model import FAMILY_SHAPES, SHAPES, write_shaped_model  # noqa: E402
from tandem.common.tokenizer import TextTokenizer  # noqa: E402
from tandem.workers.backends.mlx.backend import MlxBackend  # noqa: E402
from tandem.workers.backends.mlx.model import load_mlx_model  # noqa: E402
from tests.parity import llama_ref  # noqa: E402
from tests.parity.test_mlx_backend import Harness, greedy  # noqa: E402
from tests.parity.test_mlx_model import PARITY_TEXT  # noqa: E402

pytestmark = [pytest.mark.mlx, pytest.mark.model]
MESSAGES = [
    {"role": "user", "content": "Name three primary colors."},
    {"role": "assistant", "content": "Red, yellow and blue."},
    {"role": "user", "content": "And secondary?"},
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("families")


@pytest.fixture(scope="module", params=FAMILY_SHAPES)
def shaped(request: pytest.FixtureRequest, folder: Path):
    """(name, GGUF path, (model, spec, config)) for one family's miniature."""
    name = request.param
    try:
        path = write_shaped_model(SHAPES[name], folder / f"{name}.gguf")
    except FileNotFoundError as e:  # the family's vocabulary could not be fetched
        pytest.skip(str(e))
    return name, path, load_mlx_model(path, cache_dir=folder / "mlx")


def test_token_ids_match_llama_cpp(shaped) -> None:
    _, path, (_, spec, _) = shaped
    tok = TextTokenizer(spec)
    rng = random.Random(3)
    texts = [llama_ref.random_text(rng) for _ in range(150)]
    skip = int(spec.add_bos)
    with llama_ref.llama_vocab(path) as vocab:
        bad = [
            t
            for t in texts
            if tok.encode(t, parse_special=False)[skip:]
            != llama_ref.llama_tokenize(vocab, t, False)
        ]
        assert bad == []
        assert set(spec.eos_ids) == llama_ref.llama_eog_ids(vocab)
        if spec.chat_template:
            prompt = tok.apply_chat_template(MESSAGES)
            assert tok.encode(prompt)[skip:] == llama_ref.llama_tokenize(vocab, prompt, True)


def test_chat_template_renders_as_llama_cpp(shaped) -> None:
    """llama.cpp's built-in formatter for the template it recognises in the file.
    That formatter adds no default system prompt (Qwen2's Jinja template does), so
    the ChatML conversation brings its own."""
    name, _, (_, spec, _) = shaped
    if not spec.chat_template:
        pytest.skip(f"{name} has no chat template")
    messages = MESSAGES
    if "<|im_start|>" in spec.chat_template:
        messages = [{"role": "system", "content": "Be brief."}, *MESSAGES]
    ours = TextTokenizer(spec).apply_chat_template(messages)
    assert ours == llama_chat_format(spec.chat_template, messages)


def test_logits_match_llama_cpp(shaped) -> None:
    name, path, (model, spec, _) = shaped
    ids = TextTokenizer(spec).encode(PARITY_TEXT)
    ref = llama_ref.llama_logits(path, ids)
    ours = np.array(model(mx.array([ids]))[0].astype(mx.float32))
    top1 = float(np.mean(ours.argmax(-1) == ref.argmax(-1)))
    nll_mlx, nll_ref = llama_ref.mean_nll(ours, ids), llama_ref.mean_nll(ref, ids)
    print(f"\n{name}: top-1 {top1:.1%}, NLL MLX {nll_mlx:.4f} vs llama.cpp {nll_ref:.4f}")
    assert top1 >= 0.90
    assert abs(nll_mlx - nll_ref) / nll_ref < 0.02


def test_cached_folder_loads_the_same_model(shaped, folder: Path) -> None:
    """The second load reads the converted mlx-lm folder: same logits (Llama 3.1's
    rope_freqs, Gemma's norms ... survive the round trip)."""
    _, path, (model, spec, _) = shaped
    again, spec2, _ = load_mlx_model(path, cache_dir=folder / "mlx")
    ids = mx.array([TextTokenizer(spec).encode(PARITY_TEXT)[:40]])
    assert spec2 == spec
    assert mx.allclose(model(ids), again(ids), atol=1e-4).item()


def test_batched_decode_equals_each_request_alone(shaped) -> None:
    _, _, loaded = shaped
    rng = random.Random(5)
    vocab = min(int(loaded[2]["vocab_size"]), 30000)
    prompts = [[rng.randrange(300, vocab) for _ in range(n)] for n in (7, 30, 55)]
    budgets = (8, 5, 10)
    reqs = [greedy(f"r{i}", prompts[i], m) for i, m in enumerate(budgets)]
    alone = {}
    for r in reqs:
        alone |= Harness(loaded).run(greedy(r.id, r.prompt, r.max_tokens))
    h = Harness(loaded, step_tokens=32)
    batched = h.run(*reqs)
    assert batched == alone
    h.assert_released()


def test_a_k_quant_mix_loads_and_matches_llama_cpp(folder: Path) -> None:
    """Q4_K_M as llama.cpp writes it: rows of 64 are no multiple of 256, so it falls
    back to Q5_0/Q5_1/Q8_0, which mx.load cannot read: the gguf dequantizer path."""
    from studies.models.requant import quantize
    from tandem.workers.backends.mlx.gguf import convert_gguf

    src = write_shaped_model(SHAPES["tiny"], folder / "tiny.gguf")
    path = quantize(src, folder / "tiny-q4_k_m.gguf", ftype=15)
    model, spec, config = convert_gguf(path)
    assert config["quantization"]["bits"] == 8
    ids = TextTokenizer(spec).encode(PARITY_TEXT)
    ref = llama_ref.llama_logits(path, ids)
    ours = np.array(model(mx.array([ids]))[0].astype(mx.float32))
    assert float(np.mean(ours.argmax(-1) == ref.argmax(-1))) >= 0.90
    nll_mlx, nll_ref = llama_ref.mean_nll(ours, ids), llama_ref.mean_nll(ref, ids)
    assert abs(nll_mlx - nll_ref) / nll_ref < 0.02


def test_gemma2_context_is_capped_at_its_sliding_window(folder: Path, monkeypatch) -> None:
    path = write_shaped_model(SHAPES["tiny-gemma2"], folder / "tiny-gemma2.gguf")
    monkeypatch.setenv("TANDEM_CACHE_DIR", str(folder / "cache"))  # not the user's cache
    backend = MlxBackend(path, n_ctx=8192, device="cpu")
    assert backend.n_ctx == 4096


def llama_chat_format(template: str, messages: list[dict[str, str]]) -> str:
    llama_cpp = pytest.importorskip("llama_cpp")
    chat = (llama_cpp.llama_chat_message * len(messages))()
    keep = []
    for slot, m in zip(chat, messages, strict=True):
        role, content = m["role"].encode(), m["content"].encode()
        keep += [role, content]
        slot.role, slot.content = role, content
    buf = ctypes.create_string_buffer(8192)
    n = llama_cpp.llama_chat_apply_template(template.encode(), chat, len(messages), True, buf, 8192)
    assert 0 <= n <= len(buf), "llama.cpp does not recognise the template"
    return buf.raw[:n].decode()
