"""What re-quantizing K-quants for MLX costs: memory, decode speed, NLL vs llama.cpp.

    python -m studies.models.requant MODEL.gguf [--ftype 15] [--tokens 32]

Quantizes MODEL.gguf with llama.cpp (`--ftype`, default 15 = Q4_K_M), then loads
the result three ways and scores the same text: llama.cpp itself, MLX with the
K-quant tensors re-quantized to affine (tandem's default), and MLX with them kept
as the float16 `mx.load` returns. Prints one markdown table (docs/MLX.md).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

TEXT = (
    "The river runs through the middle of the old town, and on summer evenings people "
    "gather along its banks to watch the light fade behind the hills. Children throw bread "
    "to the ducks while their parents talk about the day. Further down, near the stone "
    "bridge, a small market sells fresh bread, cheese and vegetables from the farms nearby."
)


def quantize(src: Path, out: Path, ftype: int) -> Path:
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.allow_requantize = True  # the source may itself be quantized
    if llama_cpp.llama_model_quantize(str(src).encode(), str(out).encode(), params) != 0:
        raise RuntimeError(f"llama.cpp could not quantize {src}")
    return out


def _as_read(weights: dict[str, Any], types: dict[str, int], bits: int | None = None) -> Any:
    """``gguf.requantize`` that keeps float16 (what the file dequantized to)."""
    return weights


def mlx_row(path: Path, ids: list[int], requant: int | None, n_decode: int) -> dict[str, Any]:
    """requant: None keeps float16, 0 the file's bits, else that many bits."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    from tandem.workers.backends.mlx import gguf

    keep_fn, keep_bits = gguf.requantize, gguf.REQUANT_BITS_DEFAULT
    if requant is None:
        gguf.requantize = _as_read
    gguf.REQUANT_BITS_DEFAULT = requant or None
    try:
        model, _, _ = gguf.convert_gguf(path)
    finally:
        gguf.requantize, gguf.REQUANT_BITS_DEFAULT = keep_fn, keep_bits
    logits = np.array(model(mx.array([ids]))[0].astype(mx.float32))
    param_bytes = sum(v.nbytes for v in dict(tree_flatten(model.parameters())).values())
    tok_s = _decode_rate(model, ids, n_decode)
    return {"logits": logits, "mem_mb": param_bytes / 1e6, "tok_s": tok_s}


def _decode_rate(model: Any, ids: list[int], n: int) -> float:
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    start_s = time.monotonic()
    for i, (token, _) in enumerate(generate_step(mx.array(ids[:16]), model, max_tokens=n)):
        mx.eval(token)
        if i == 0:
            start_s = time.monotonic()  # decode only: the first token ends the prefill
    return (n - 1) / (time.monotonic() - start_s)


def main() -> None:
    from studies.models.llama_logits import llama_logits, mean_nll
    from tandem.common.tokenizer import TextTokenizer, tokenizer_spec_from_gguf

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--ftype", type=int, default=15)
    ap.add_argument("--tokens", type=int, default=32)
    args = ap.parse_args()
    out = quantize(args.model, Path(tempfile.mkdtemp()) / "quantized.gguf", args.ftype)
    ids = TextTokenizer(tokenizer_spec_from_gguf(out)).encode(TEXT)
    ref = llama_logits(out, ids)
    print(f"{args.model.name} -> ftype {args.ftype}: {out.stat().st_size / 1e6:.1f} MB file, "
          f"{len(ids)} tokens, llama.cpp NLL {mean_nll(ref, ids):.4f}\n")  # fmt: skip
    print("| MLX load | weights MB | decode tok/s | NLL | NLL vs llama.cpp | top-1 agree |")
    print("|---|---|---|---|---|---|")
    ways = (("re-quantized, the file's bits", 0), ("re-quantized, 8 bits (default)", 8),
            ("float16", None))  # fmt: skip
    for name, requant in ways:
        row = mlx_row(out, ids, requant, args.tokens)
        nll = mean_nll(row["logits"], ids)
        top1 = float(np.mean(row["logits"].argmax(-1) == ref.argmax(-1)))
        change = (nll - mean_nll(ref, ids)) / mean_nll(ref, ids)
        print(f"| {name} | {row['mem_mb']:.1f} | {row['tok_s']:.1f} | {nll:.4f} | "
              f"{change:+.2%} | {top1:.1%} |")  # fmt: skip


if __name__ == "__main__":
    main()
