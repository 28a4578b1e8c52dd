"""Gemma and Gemma 2 (GGUF architectures "gemma", "gemma2") -> mlx-lm `gemma` / `gemma2`.

HF Gemma norms multiply by (1 + w); convert_hf_to_gguf stores 1 + w so llama.cpp
multiplies plainly. mlx-lm's classes add the 1 themselves, so it is taken off
again. Gemma 2 adds post-attention and post-FFN norms and soft-capping. Its
sliding window (every other layer, 4096 tokens) is not in mlx-lm's gemma2: past
that many tokens of context the MLX worker would attend further than llama.cpp,
so the worker caps its context at the window (`max_context` in the config).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.models import gemma2

from tandem.workers.backends.mlx.arch import common as c

GEMMA2_NAMES = {
    **c.BLOCK_NAMES,
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
GEMMA2_27B_LAYERS = 46  # llama.cpp scales queries by hidden/heads only for the 27B model
MAX_CONTEXT_KEY = "tandem_max_context"


def _minus_one_on_norms(block: str, suffix: str, w: mx.array, config: dict[str, Any]) -> mx.array:
    return w - 1.0 if block.endswith("norm") else w


def gemma_config(meta: c.GgufMetadata, weights: c.Weights) -> dict[str, Any]:
    c.refuse_rope_scaling(meta)
    config = c.base_config(meta, weights, meta.name)
    if not config.pop("tie_word_embeddings"):
        raise ValueError("mlx-lm's gemma ties the output head; this GGUF has its own")
    if meta.name == "gemma2":
        config["attn_logit_softcapping"] = meta.arch("attn_logit_softcapping", 50.0)
        config["final_logit_softcapping"] = meta.arch("final_logit_softcapping", 30.0)
        per_head = config["num_hidden_layers"] == GEMMA2_27B_LAYERS
        heads = config["num_attention_heads"]
        config["query_pre_attn_scalar"] = (
            config["hidden_size"] // heads if per_head else config["head_dim"]
        )
        config[MAX_CONTEXT_KEY] = meta.arch("attention.sliding_window", 4096)
    return config


def gemma_tensors(weights: c.Weights, config: dict[str, Any]) -> c.Weights:
    names = GEMMA2_NAMES if config["model_type"] == "gemma2" else c.BLOCK_NAMES
    out = c.rename(weights, config, block_names=names, transform=_minus_one_on_norms)
    out["model.norm.weight"] = out["model.norm.weight"] - 1.0
    return out


class _Gemma2Attention(gemma2.Attention):
    """mlx-lm's gemma2 attention groups query heads as (kv heads, repeats) but indexes
    an array mask as (batch, heads): a per-row mask (batched decode with padding)
    fails to broadcast. One more axis makes it broadcast over the groups."""

    def __call__(self, x: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
        if isinstance(mask, mx.array) and mask.ndim == 4 and self.repeats > 1:
            mask = mx.expand_dims(mask, 2)
        return super().__call__(x, mask, cache)


def fix_gemma2_attention(model: Any, config: dict[str, Any]) -> None:
    for layer in model.model.layers:
        layer.self_attn.__class__ = _Gemma2Attention


GEMMA = c.Family("gemma", gemma_config, gemma_tensors)
GEMMA2 = c.Family("gemma2", gemma_config, gemma_tensors, finish=fix_gemma2_attention)
