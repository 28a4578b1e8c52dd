"""What the family mappings share: metadata access, the common config, tensor renaming."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

# llama.cpp block tensor -> HF module path, for the families that keep HF's layout.
BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}

Weights = dict[str, mx.array]
# (GGUF block tensor such as "attn_q", suffix such as "weight" or "scales", the array,
# config) -> the array HF expects
Transform = Callable[[str, str, mx.array, dict[str, Any]], mx.array]


class GgufMetadata:
    """`mx.load`'s GGUF metadata with plain Python values; `arch(key)` reads `<arch>.key`."""

    def __init__(self, raw: dict[str, Any]) -> None:
        self._raw = raw
        self.name = self.get("general.architecture")

    def get(self, key: str, default: Any = None) -> Any:
        value = self._raw.get(key, default)
        if isinstance(value, mx.array):
            return value.item() if value.size == 1 and value.ndim == 0 else value.tolist()
        return value

    def arch(self, key: str, default: Any = None) -> Any:
        return self.get(f"{self.name}.{key}", default)


@dataclass(frozen=True)
class Family:
    """How one GGUF architecture becomes one mlx-lm model class."""

    model_type: str  # the mlx_lm.models module
    config: Callable[[GgufMetadata, Weights], dict[str, Any]]
    tensors: Callable[[Weights, dict[str, Any]], Weights]
    # applied after every load, from GGUF or from a converted folder
    finish: Callable[[Any, dict[str, Any]], None] | None = None


def base_config(meta: GgufMetadata, weights: Weights, model_type: str) -> dict[str, Any]:
    """The mlx-lm ModelArgs fields every family shares."""
    n_heads = meta.arch("attention.head_count")
    hidden = meta.arch("embedding_length")
    return {
        "model_type": model_type,
        "hidden_size": hidden,
        "num_hidden_layers": meta.arch("block_count"),
        "intermediate_size": meta.arch("feed_forward_length"),
        "num_attention_heads": n_heads,
        "num_key_value_heads": meta.arch("attention.head_count_kv", n_heads),
        "head_dim": meta.arch("attention.key_length")
        or meta.arch("rope.dimension_count")
        or hidden // n_heads,
        "rms_norm_eps": meta.arch("attention.layer_norm_rms_epsilon", 1e-5),
        "vocab_size": weights["token_embd.weight"].shape[0],
        "rope_theta": meta.arch("rope.freq_base", 10000.0),
        "max_position_embeddings": meta.arch("context_length"),
        "tie_word_embeddings": "output.weight" not in weights,
    }


def refuse_rope_scaling(meta: GgufMetadata, allowed: tuple[str, ...] = ("none",)) -> None:
    kind = meta.arch("rope.scaling.type", "none")
    if kind not in allowed:
        raise ValueError(
            f"{meta.name} GGUF with rope scaling {kind!r} is not supported by the MLX worker "
            f"(supported: {', '.join(allowed)})"
        )


def rename(
    weights: Weights,
    config: dict[str, Any],
    block_names: dict[str, str] = BLOCK_NAMES,
    transform: Transform | None = None,
) -> Weights:
    """llama.cpp tensor names -> HF names, each block tensor through `transform`."""
    out: Weights = {}
    for name, w in weights.items():
        base, suffix = name.rsplit(".", 1)  # weight / bias, or scales / biases if quantized
        parts = base.split(".")
        if parts[0] == "blk" and len(parts) == 3 and parts[2] in block_names:
            if transform is not None:
                w = transform(parts[2], suffix, w, config)
            out[f"model.layers.{parts[1]}.{block_names[parts[2]]}.{suffix}"] = w
        elif base in TOP_NAMES:
            out[f"{TOP_NAMES[base]}.{suffix}"] = w
        else:
            raise ValueError(f"unexpected GGUF tensor {name!r} for {config['model_type']}")
    return out
