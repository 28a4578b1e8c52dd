"""Loading the GGUF into mlx-lm: parity with llama.cpp, the disk cache, the tiny model."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")

from tandem.common.model_files import default_model_path  # noqa: E402
from tandem.common.tokenizer import TextTokenizer  # noqa: E402
from tandem.workers.backends.mlx import model as mlx_model  # noqa: E402
from tandem.workers.backends.mlx.arch.llama import unpermute_rows  # noqa: E402
from tandem.workers.backends.mlx.model import gguf_cache_path, load_mlx_model, make_tiny_model  # noqa: E402
from tests.parity.llama_ref import llama_logits, mean_nll  # noqa: E402

pytestmark = pytest.mark.mlx

# ~150 tokens of ordinary English prose: the parity text.
PARITY_TEXT = (
    "The river runs through the middle of the old town, and on summer evenings people "
    "gather along its banks to watch the light fade behind the hills. Children throw bread "
    "to the ducks while their parents talk about the day. Further down, near the stone "
    "bridge, a small market sells fresh bread, cheese and vegetables from the farms nearby. "
    "Most of the shops close early, but the cafe on the corner stays open late, and its "
    "owner knows nearly everyone by name. Visitors often say that the town feels like a "
    "place where time moves a little more slowly, and that is exactly why so many of them "
    "come back every year. In the autumn the leaves turn red and gold, and the first "
    "frost arrives long before anyone is ready for it."
)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mlx-cache")


@pytest.fixture(scope="module")
def gguf_path() -> Path:
    try:
        return default_model_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def loaded(gguf_path: Path, cache_dir: Path):
    """The first load: converts the GGUF and fills the cache."""
    start_s = time.monotonic()
    result = load_mlx_model(gguf_path, cache_dir=cache_dir)
    print(f"\nGGUF -> MLX conversion: {time.monotonic() - start_s:.2f} s")
    return result


def test_gguf_config_and_quantization(loaded) -> None:
    model, spec, config = loaded
    assert config["num_hidden_layers"] == 30 and config["hidden_size"] == 576
    assert config["num_attention_heads"] == 9 and config["num_key_value_heads"] == 3
    assert config["tie_word_embeddings"] and config["rope_theta"] == 100000.0
    # Q4_1 layers by default, Q8_0 embeddings as the one exception.
    assert config["quantization"]["bits"] == 4
    assert config["quantization"]["model.embed_tokens"] == {"group_size": 32, "bits": 8}
    assert model.model.embed_tokens.bits == 8
    assert model.model.layers[0].self_attn.q_proj.bits == 4
    assert spec.eos_ids[0] == 2


def test_second_load_hits_the_disk_cache(loaded, gguf_path: Path, cache_dir: Path, monkeypatch):
    _, spec, config = loaded
    folder = gguf_cache_path(gguf_path, cache_dir)
    assert (folder / "model.safetensors").is_file() and (folder / "config.json").is_file()
    assert not [p for p in cache_dir.iterdir() if p.name.startswith(".")], "temp dir left behind"

    def no_conversion(path: Path):
        raise AssertionError("converted again instead of using the cache")

    monkeypatch.setattr(mlx_model, "convert_gguf", no_conversion)
    start_s = time.monotonic()
    model2, spec2, config2 = load_mlx_model(gguf_path, cache_dir=cache_dir)
    print(f"\ncached load: {time.monotonic() - start_s:.2f} s")
    assert spec2 == spec
    assert config2["quantization"] == config["quantization"]
    assert model2.model.embed_tokens.bits == 8


def test_stale_cache_format_is_rebuilt(gguf_path: Path, tmp_path: Path, loaded, cache_dir: Path):
    folder = gguf_cache_path(gguf_path, tmp_path)
    shutil.copytree(gguf_cache_path(gguf_path, cache_dir), folder)
    (folder / mlx_model.MARKER_FILE).write_text(json.dumps({"format": -1}))
    load_mlx_model(gguf_path, cache_dir=tmp_path)
    marker = json.loads((folder / mlx_model.MARKER_FILE).read_text())
    assert marker["format"] == mlx_model.CACHE_FORMAT


def test_corrupt_cache_is_replaced(gguf_path, tmp_path, loaded, cache_dir, monkeypatch):
    folder = gguf_cache_path(gguf_path, tmp_path)
    shutil.copytree(gguf_cache_path(gguf_path, cache_dir), folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # as if a copy was cut short
    load_mlx_model(gguf_path, cache_dir=tmp_path)
    monkeypatch.setattr(mlx_model, "convert_gguf", None)  # a third load must not convert
    model, _, _ = load_mlx_model(gguf_path, cache_dir=tmp_path)
    assert model.model.embed_tokens.bits == 8


def test_hf_folder_without_spec_file_gives_the_same_spec(loaded, gguf_path, cache_dir, tmp_path):
    """The cache is a plain mlx-lm folder; its HF tokenizer files rebuild the same spec."""
    _, spec, _ = loaded
    folder = tmp_path / "hf"
    shutil.copytree(gguf_cache_path(gguf_path, cache_dir), folder)
    (folder / mlx_model.SPEC_FILE).unlink()
    assert mlx_model._spec_from_folder(folder) == spec


def _llama_cpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's `permute`, the transform the loader must undo."""
    return (
        w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def test_unpermute_inverts_llama_cpp_permute_on_quantized_rows() -> None:
    rng = np.random.default_rng(0)
    n_heads, head_dim, dim = 3, 8, 64
    hf = mx.array(rng.standard_normal((n_heads * head_dim, dim)).astype(np.float32))
    packed = mx.quantize(hf, group_size=32, bits=4)  # (weight, scales, biases), rows = outputs
    restored = [
        unpermute_rows(mx.array(_llama_cpp_permute(np.array(p), n_heads)), n_heads) for p in packed
    ]
    for before, after in zip(packed, restored, strict=True):
        assert mx.array_equal(before, after).item()
    assert not mx.array_equal(packed[0], mx.array(_llama_cpp_permute(np.array(packed[0]), 3)))


def test_bad_paths_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_mlx_model(tmp_path / "missing.gguf", cache_dir=tmp_path)
    (tmp_path / "model.bin").write_bytes(b"x")
    with pytest.raises(ValueError, match="gguf"):
        load_mlx_model(tmp_path / "model.bin", cache_dir=tmp_path)


@pytest.mark.model
def test_predictions_match_llama_cpp(loaded, gguf_path: Path) -> None:
    model, spec, _ = loaded
    ids = TextTokenizer(spec).encode(PARITY_TEXT)
    assert 130 <= len(ids) <= 170
    ref = llama_logits(gguf_path, ids)
    start_s = time.monotonic()
    ours = model(mx.array([ids]))[0].astype(mx.float32)
    mx.eval(ours)
    ours_np = np.array(ours)
    elapsed_s = time.monotonic() - start_s
    top1 = float(np.mean(ours_np.argmax(-1) == ref.argmax(-1)))
    nll_mlx, nll_ref = mean_nll(ours_np, ids), mean_nll(ref, ids)
    print(
        f"\n{len(ids)} tokens, MLX forward {elapsed_s:.1f} s: top-1 agreement {top1:.1%}, "
        f"mean NLL MLX {nll_mlx:.4f} vs llama.cpp {nll_ref:.4f}"
    )
    assert top1 >= 0.90
    assert abs(nll_mlx - nll_ref) / nll_ref < 0.02


def test_tiny_model_is_deterministic_and_fast() -> None:
    model, spec, config = make_tiny_model(seed=3)
    ids = TextTokenizer(spec).encode("Hello there, tiny model.")
    logits = model(mx.array([ids]))
    assert logits.shape == (1, len(ids), config["vocab_size"])
    again, _, _ = make_tiny_model(seed=3)
    other, _, _ = make_tiny_model(seed=4)
    assert mx.allclose(logits, again(mx.array([ids]))).item()
    assert not mx.allclose(logits, other(mx.array([ids]))).item()
