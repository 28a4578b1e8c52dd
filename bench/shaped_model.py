"""A GGUF with the shape of a known model and random weights: for timing, never text.

    python -m tandem.bench.shaped_model qwen2.5-0.5b /tmp/qwen2.5-0.5b-shaped.gguf

Where the model itself cannot be downloaded, its speed can still be measured:
what a forward pass costs depends on the shapes (hidden size, layers, heads, KV
heads, FFN width, vocabulary) and the quantization, not on the weights' values.
The file is a llama-architecture GGUF, so both workers load it as they load the
default model; it keeps the default model's tokenizer (the same prompts tokenize
to the same ids), padded with unused tokens up to the shape's vocabulary so the
embedding and output head have their real size. Left out of the shape: Qwen2's
q/k/v biases (three vector adds per layer). Weights are random Q8_0 blocks with a
small scale, norms are ones: the output is noise, so benchmarks with such a model
must ignore EOS (tandem bench does).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np

Q8_0_BLOCK = 32  # weights per Q8_0 block: one float16 scale, 32 int8 values
UNUSED_TOKEN = 5  # llama_token_type LLAMA_TOKEN_TYPE_UNUSED


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    rope_base: float = 10000.0
    rms_eps: float = 1e-6
    context: int = 32768


SHAPES = {
    # Qwen2.5-0.5B(-Instruct), config.json: 494M parameters, embeddings tied.
    "qwen2.5-0.5b": Shape(896, 24, 14, 2, 4864, 151936, rope_base=1e6),
    # A few-layer miniature of the same layout, for tests.
    "tiny": Shape(64, 2, 4, 2, 128, 50000),
}


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


def write_shaped_model(shape: Shape, path: Path, like: Path | None = None, seed: int = 0) -> Path:
    """Write ``path``: ``shape`` with random weights and ``like``'s tokenizer, padded."""
    import gguf

    from tandem.common.model_files import default_model_path
    from tandem.common.tokenizer import GgufMeta

    source = GgufMeta(like or default_model_path())
    tokens: list[str] = source.get("tokenizer.ggml.tokens")
    if len(tokens) > shape.vocab:
        raise ValueError(f"the tokenizer has {len(tokens)} tokens, more than {shape.vocab}")
    types: list[int] = source.get("tokenizer.ggml.token_type")
    pad = shape.vocab - len(tokens)
    tokens += [f"<|tandem_unused_{i}|>" for i in range(pad)]
    types += [UNUSED_TOKEN] * pad

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(f"random weights shaped like {path.stem}")
    w.add_block_count(shape.layers)
    w.add_context_length(shape.context)
    w.add_embedding_length(shape.hidden)
    w.add_feed_forward_length(shape.ffn)
    w.add_head_count(shape.heads)
    w.add_head_count_kv(shape.kv_heads)
    w.add_rope_freq_base(shape.rope_base)
    w.add_layer_norm_rms_eps(shape.rms_eps)
    w.add_rope_dimension_count(shape.hidden // shape.heads)
    w.add_vocab_size(shape.vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    w.add_tokenizer_model(source.get("tokenizer.ggml.model"))
    w.add_tokenizer_pre(source.get("tokenizer.ggml.pre"))
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(source.get("tokenizer.ggml.merges"))
    for key, add in (("bos", w.add_bos_token_id), ("eos", w.add_eos_token_id),
                     ("unknown", w.add_unk_token_id), ("padding", w.add_pad_token_id)):  # fmt: skip
        token_id = source.get(f"tokenizer.ggml.{key}_token_id")
        if token_id is not None:
            add(int(token_id))
    w.add_add_bos_token(False)

    rng = np.random.default_rng(seed)
    head_dim = shape.hidden // shape.heads
    kv = shape.kv_heads * head_dim
    q8 = gguf.GGMLQuantizationType.Q8_0

    def matrix(name: str, rows: int, cols: int) -> None:  # rows = outputs, cols = inputs
        w.add_tensor(name, q8_0_random(rows, cols, rng, 0.02), raw_dtype=q8)  # shape from bytes

    ones = np.ones(shape.hidden, dtype=np.float32)
    matrix("token_embd.weight", shape.vocab, shape.hidden)  # tied: also the output head
    for i in range(shape.layers):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", ones)
        matrix(b + "attn_q.weight", shape.hidden, shape.hidden)
        matrix(b + "attn_k.weight", kv, shape.hidden)
        matrix(b + "attn_v.weight", kv, shape.hidden)
        matrix(b + "attn_output.weight", shape.hidden, shape.hidden)
        w.add_tensor(b + "ffn_norm.weight", ones)
        matrix(b + "ffn_gate.weight", shape.ffn, shape.hidden)
        matrix(b + "ffn_up.weight", shape.ffn, shape.hidden)
        matrix(b + "ffn_down.weight", shape.hidden, shape.ffn)
    w.add_tensor("output_norm.weight", ones)
    path.parent.mkdir(parents=True, exist_ok=True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("shape", choices=sorted(SHAPES))
    ap.add_argument("out", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    path = write_shaped_model(SHAPES[args.shape], args.out, seed=args.seed)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.0f} MB)")


if __name__ == "__main__":
    main()
