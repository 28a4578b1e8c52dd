"""Phi-3 / Phi-3.5 mini (GGUF architecture "phi3") -> mlx-lm `phi3`.

Both keep Q, K and V in one fused `qkv` matrix and gate and up in one `gate_up`
matrix (gate rows first), so the tensors map one to one; RoPE is NeoX-style in
both. The 128k-context variants (LongRoPE, `rope_factors_long/short` tensors) are
refused.
"""

from __future__ import annotations

from typing import Any

from tandem.workers.backends.mlx.arch import common as c

PHI3_NAMES = {
    **c.BLOCK_NAMES,
    "attn_qkv": "self_attn.qkv_proj",
    "ffn_up": "mlp.gate_up_proj",  # llama.cpp's fused up holds gate then up, as HF's
}


def phi3_config(meta: c.GgufMetadata, weights: c.Weights) -> dict[str, Any]:
    if any(name.startswith("rope_factors") for name in weights):
        raise ValueError("Phi-3 GGUF with LongRoPE factors (128k context) is not supported by MLX")
    config = c.base_config(meta, weights, "phi3")
    if config["head_dim"] * config["num_attention_heads"] != config["hidden_size"]:
        raise ValueError("mlx-lm's phi3 needs head_dim x heads == hidden size")
    config["original_max_position_embeddings"] = meta.arch(
        "rope.scaling.original_context_length", config["max_position_embeddings"]
    )
    return config


def phi3_tensors(weights: c.Weights, config: dict[str, Any]) -> c.Weights:
    return c.rename(weights, config, block_names=PHI3_NAMES)


PHI3 = c.Family("phi3", phi3_config, phi3_tensors)
