"""Qwen2 / Qwen2.5 (GGUF architecture "qwen2") -> mlx-lm `qwen2`.

Q/K/V carry biases; the small models tie the output head to the embedding.
llama.cpp runs Qwen2 with NeoX-style RoPE, the HF layout, so rows stay as they are.
"""

from __future__ import annotations

from typing import Any

from tandem.workers.backends.mlx.arch import common as c


def qwen2_config(meta: c.GgufMetadata, weights: c.Weights) -> dict[str, Any]:
    c.refuse_rope_scaling(meta)  # YaRN long-context variants: see docs/MLX.md
    config = c.base_config(meta, weights, "qwen2")
    if config["head_dim"] * config["num_attention_heads"] != config["hidden_size"]:
        raise ValueError("mlx-lm's qwen2 needs head_dim x heads == hidden size")
    return config


QWEN2 = c.Family("qwen2", qwen2_config, c.rename)
