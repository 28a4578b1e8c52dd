"""Llama 1/2/3.x and Mistral 7B (GGUF architecture "llama") -> mlx-lm `llama`.

convert_hf_to_gguf permutes Q/K rows for llama.cpp's interleaved RoPE; they are
put back in HF's half-split layout. Llama 3.1+ RoPE scaling travels as the
`rope_freqs` tensor (one divisor per frequency), which is applied exactly
through `mx.fast.rope(freqs=...)` instead of being re-derived from parameters.
Mistral 7B v0.1's 4096-token sliding window is in neither GGUF nor llama.cpp's
llama graph, so both backends attend to the whole context alike.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn

from tandem.workers.backends.mlx.arch import common as c

ROPE_FREQS_KEY = "tandem_rope_freqs"  # config.json key: mlx-lm ignores it, tandem applies it


def llama_config(meta: c.GgufMetadata, weights: c.Weights) -> dict[str, Any]:
    c.refuse_rope_scaling(meta, ("none", "linear"))
    config = c.base_config(meta, weights, "llama")
    config["attention_bias"] = "blk.0.attn_q.bias" in weights
    config["mlp_bias"] = "blk.0.ffn_up.bias" in weights
    if meta.arch("rope.scaling.type") == "linear":
        config["rope_scaling"] = {"type": "linear", "factor": meta.arch("rope.scaling.factor")}
    if "rope_freqs.weight" in weights:
        config[ROPE_FREQS_KEY] = weights["rope_freqs.weight"].astype(mx.float32).tolist()
    return config


def llama_tensors(weights: c.Weights, config: dict[str, Any]) -> c.Weights:
    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}

    def unpermute(block: str, suffix: str, w: mx.array, config: dict[str, Any]) -> mx.array:
        return unpermute_rows(w, heads[block]) if block in heads else w

    weights = {k: v for k, v in weights.items() if k != "rope_freqs.weight"}
    return c.rename(weights, config, transform=unpermute)


def unpermute_rows(w: mx.array, n_heads: int) -> mx.array:
    """Undo convert_hf_to_gguf's `permute` on output rows.

    llama.cpp interleaves each head's two rope halves (rows [h, 2, d/2] -> [h, d/2, 2]).
    Only whole rows move, so a quantized weight and its scales and biases (all with
    one row per output) are reordered alike and the packed values stay valid.
    """
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


class FreqFactorRoPE(nn.Module):
    """RoPE with per-frequency divisors, as llama.cpp applies `rope_freqs`."""

    def __init__(self, dims: int, base: float, factors: list[float]) -> None:
        super().__init__()
        self.dims = dims
        periods = base ** (mx.arange(0, dims, 2, dtype=mx.float32) / dims)
        self._freqs = periods * mx.array(factors, dtype=mx.float32)  # underscore: not a weight

    def __call__(self, x: mx.array, offset: int = 0) -> mx.array:
        return mx.fast.rope(
            x, self.dims, traditional=False, base=None, scale=1.0, offset=offset, freqs=self._freqs
        )


def apply_rope_freqs(model: nn.Module, config: dict[str, Any]) -> None:
    """Swap every attention layer's RoPE for the `rope_freqs` one, if the config has it."""
    factors = config.get(ROPE_FREQS_KEY)
    if not factors:
        return
    dims = config["head_dim"]
    rope = FreqFactorRoPE(dims, float(config["rope_theta"]), factors)
    for layer in model.model.layers:
        layer.self_attn.rope = rope


LLAMA = c.Family("llama", llama_config, llama_tensors, finish=apply_rope_freqs)
