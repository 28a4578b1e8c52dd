"""GGUFs with the shape of a known model and random weights: for timing and parity, never text.

    python -m studies.models.shaped_model qwen2.5-0.5b /tmp/qwen2.5-0.5b-shaped.gguf
    python -m studies.models.shaped_model tiny-phi3 /tmp/tiny-phi3.gguf
    python -m studies.models.shaped_model qwen2.5-0.5b OUT.gguf --vocab qwen2  # Qwen's tokenizer

Where the model itself cannot be downloaded, its speed can still be measured:
what a forward pass costs depends on the shapes (hidden size, layers, heads, KV
heads, FFN width, vocabulary) and the quantization, not on the weights' values.
Each shape names its architecture and writes that architecture's tensors (Qwen2's
q/k/v biases, Phi-3's fused qkv and gate-up, Gemma 2's extra norms, Llama 3.1's
rope_freqs), so both workers load it through the same code paths as the real
family. The tokenizer is copied from a real vocabulary (studies/models/shaped_vocab.py),
padded with unused tokens up to the shape's vocabulary. Weights are random Q8_0
blocks (std 1/sqrt(inputs), embeddings 0.5), norms near one: the output is noise, so benchmarks
with such a model must ignore EOS (tandem bench does).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from studies.models.shaped_vocab import (
    GEMMA_VOCAB,
    LLAMA3_TEMPLATE,
    MISTRAL_TEMPLATE,
    VocabSource,
    tokenizer_kv,
)

if TYPE_CHECKING:  # imported where a file is written, not on import
    import gguf

Q8_0_BLOCK = 32  # weights per Q8_0 block: one float16 scale, 32 int8 values
ARCHS = ("llama", "qwen2", "phi3", "gemma", "gemma2")


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int | None = None  # None: the tokenizer's own size
    arch: str = "llama"
    head_dim: int | None = None  # None: hidden // heads
    rope_base: float = 10000.0
    rms_eps: float = 1e-6
    context: int = 32768
    tied: bool = True  # no output.weight: the embedding is the output head
    llama3_rope: int = 0  # >0: Llama 3.1's rope_freqs tensor, factor 8, for this original window
    tokenizer: VocabSource = field(default_factory=VocabSource)

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise ValueError(f"arch must be one of {ARCHS}, not {self.arch!r}")
        if self.heads % self.kv_heads or min(self.hidden, self.layers, self.ffn) < 1:
            raise ValueError("heads must be a multiple of kv_heads; sizes must be positive")

    @property
    def dim(self) -> int:
        return self.head_dim or self.hidden // self.heads


_TINY = Shape(hidden=64, layers=2, heads=4, kv_heads=2, ffn=128)
SHAPES = {
    # Qwen2.5-0.5B(-Instruct), config.json: 494M parameters, embeddings tied.
    "qwen2.5-0.5b": Shape(896, 24, 14, 2, 4864, 151936, arch="qwen2", rope_base=1e6),
    # Qwen2.5-7B(-Instruct), config.json: 7.6B parameters, its own output head; ~8.1 GB
    # as Q8_0 (written in ~16x the 0.5B's time: 9.5 s here on a busy 2-core machine).
    "qwen2.5-7b": Shape(
        3584, 28, 28, 4, 18944, 152064, arch="qwen2", rope_base=1e6, tied=False
    ),  # fmt: skip
    # A few-layer miniature of the llama layout with the default model's tokenizer.
    "tiny": Shape(64, 2, 4, 2, 128, 50000),
    # One miniature per family, each with its family's tokenizer.
    "tiny-qwen2": replace(_TINY, arch="qwen2", rope_base=1e6, tokenizer=VocabSource("qwen2")),
    # Llama 3.1 scales wavelengths past 8192 tokens; the miniature past 256, so that
    # positions within a short test prompt already depend on the scaled frequencies.
    "tiny-llama3": replace(
        _TINY,
        rope_base=5e5,
        llama3_rope=256,
        tied=False,
        tokenizer=VocabSource("llama-bpe", LLAMA3_TEMPLATE),
    ),  # fmt: skip
    "tiny-mistral": replace(
        _TINY, tied=False, rms_eps=1e-5, tokenizer=VocabSource("llama-spm", MISTRAL_TEMPLATE)
    ),  # fmt: skip
    "tiny-phi3": replace(
        _TINY, arch="phi3", tied=False, rms_eps=1e-5, tokenizer=VocabSource("phi-3")
    ),  # fmt: skip
    "tiny-gemma": replace(_TINY, arch="gemma", head_dim=32, tokenizer=GEMMA_VOCAB),
    "tiny-gemma2": replace(_TINY, arch="gemma2", head_dim=32, tokenizer=GEMMA_VOCAB),
}
FAMILY_SHAPES = tuple(name for name in SHAPES if name.startswith("tiny-"))


def q8_0_random(rows: int, cols: int, rng: np.random.Generator, scale: float) -> np.ndarray:
    """Raw Q8_0 bytes of a (rows, cols) matrix of random weights, std ~= scale."""
    if cols % Q8_0_BLOCK:
        raise ValueError(f"{cols} columns are not a multiple of {Q8_0_BLOCK}")
    blocks = rows * cols // Q8_0_BLOCK
    out = np.empty((blocks, 2 + Q8_0_BLOCK), dtype=np.uint8)
    d = np.float16(scale / 64.0)  # int8 values uniform in [-127, 127]: std ~73 x d
    out[:, :2] = np.frombuffer(d.tobytes(), dtype=np.uint8)
    out[:, 2:] = rng.integers(-127, 128, size=(blocks, Q8_0_BLOCK), dtype=np.int8).view(np.uint8)
    return out.reshape(rows, cols // Q8_0_BLOCK * (2 + Q8_0_BLOCK))


def llama3_rope_factors(dim: int, base: float, factor: float = 8.0, window: int = 8192,
                        low: float = 1.0, high: float = 4.0) -> np.ndarray:  # fmt: skip
    """Per-frequency divisors llama.cpp reads from `rope_freqs.weight` (Llama 3.1's
    rope scaling: long wavelengths slowed by `factor`, short ones kept, a ramp between)."""
    wavelen = 2 * math.pi * base ** (np.arange(0, dim, 2) / dim)
    smooth = np.clip((window / wavelen - low) / (high - low), 0.0, 1.0)
    return (1.0 / ((1 - smooth) / factor + smooth)).astype(np.float32)


def write_shaped_model(shape: Shape, path: Path, seed: int = 0) -> Path:
    """Write ``path``: ``shape``'s tensors with random weights and its tokenizer."""
    import gguf

    tok_kv, vocab = tokenizer_kv(shape.tokenizer, shape.vocab)
    w = gguf.GGUFWriter(str(path), shape.arch)
    w.add_name(f"tandem shaped {path.stem} {shape.arch}")  # llama.cpp reads phi3 in the name
    _add_hparams(w, shape, vocab)
    for key, (value, vtype, sub_type) in tok_kv.items():
        w.add_key_value(key, value, vtype, sub_type)
    _add_tensors(w, shape, vocab, np.random.default_rng(seed))
    path.parent.mkdir(parents=True, exist_ok=True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _add_hparams(w: gguf.GGUFWriter, shape: Shape, vocab: int) -> None:
    import gguf

    w.add_block_count(shape.layers)
    w.add_context_length(shape.context)
    w.add_embedding_length(shape.hidden)
    w.add_feed_forward_length(shape.ffn)
    w.add_head_count(shape.heads)
    w.add_head_count_kv(shape.kv_heads)
    w.add_rope_freq_base(shape.rope_base)
    w.add_layer_norm_rms_eps(shape.rms_eps)
    w.add_rope_dimension_count(shape.dim)
    w.add_vocab_size(vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    if shape.head_dim:
        w.add_key_length(shape.head_dim)
        w.add_value_length(shape.head_dim)
    if shape.arch == "gemma2":
        w.add_attn_logit_softcapping(50.0)
        w.add_final_logit_softcapping(30.0)
        w.add_sliding_window(4096)


def _add_tensors(w: gguf.GGUFWriter, shape: Shape, vocab: int, rng: np.random.Generator) -> None:
    import gguf

    q8 = gguf.GGMLQuantizationType.Q8_0

    def matrix(name: str, rows: int, cols: int, scale: float | None = None) -> None:
        # rows = outputs, cols = inputs. 1/sqrt(inputs) keeps every layer's contribution
        # the size of the residual, so parity tests exercise the layers, not just the head.
        scale = scale or 1 / math.sqrt(cols)
        w.add_tensor(name, q8_0_random(rows, cols, rng, scale), raw_dtype=q8)  # shape from bytes

    def vector(name: str, center: float, size: int = shape.hidden) -> None:
        w.add_tensor(name, (center + 0.1 * rng.standard_normal(size)).astype(np.float32))

    q, kv = shape.heads * shape.dim, shape.kv_heads * shape.dim
    # Logits spread like a trained model's (std ~4, not ~0.2): top-1 is then a real choice.
    matrix("token_embd.weight", vocab, shape.hidden, scale=0.5)
    if not shape.tied:
        matrix("output.weight", vocab, shape.hidden, scale=0.5)
    if shape.llama3_rope:
        factors = llama3_rope_factors(shape.dim, shape.rope_base, window=shape.llama3_rope)
        w.add_tensor("rope_freqs.weight", factors)
    for i in range(shape.layers):
        b = f"blk.{i}."
        vector(b + "attn_norm.weight", 1.0)
        if shape.arch == "phi3":
            matrix(b + "attn_qkv.weight", q + 2 * kv, shape.hidden)
        else:
            for name, rows in (("attn_q", q), ("attn_k", kv), ("attn_v", kv)):
                matrix(b + name + ".weight", rows, shape.hidden)
                if shape.arch == "qwen2":
                    vector(b + name + ".bias", 0.0, rows)
        matrix(b + "attn_output.weight", shape.hidden, q)
        vector(b + "ffn_norm.weight", 1.0)
        if shape.arch == "phi3":
            matrix(b + "ffn_up.weight", 2 * shape.ffn, shape.hidden)  # gate rows, then up rows
        else:
            matrix(b + "ffn_gate.weight", shape.ffn, shape.hidden)
            matrix(b + "ffn_up.weight", shape.ffn, shape.hidden)
        matrix(b + "ffn_down.weight", shape.hidden, shape.ffn)
        if shape.arch == "gemma2":
            vector(b + "post_attention_norm.weight", 1.0)
            vector(b + "post_ffw_norm.weight", 1.0)
    vector("output_norm.weight", 1.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("shape", choices=sorted(SHAPES))
    ap.add_argument("out", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vocab", help="llama.cpp vocabulary to use instead (e.g. qwen2)")
    args = ap.parse_args()
    shape = SHAPES[args.shape]
    if args.vocab:
        shape = dataclasses.replace(shape, tokenizer=VocabSource(args.vocab))
    path = write_shaped_model(shape, args.out, seed=args.seed)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.0f} MB)")


if __name__ == "__main__":
    main()
