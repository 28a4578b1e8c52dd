"""GGUF (llama architecture) -> mlx-lm llama Model, without dequantizing.

`mx.load` reads Q4_0 / Q4_1 / Q8_0 tensors straight into MLX quantized arrays
(group size 32). What is left: llama.cpp's tensor names become HF names, llama.cpp's
Q/K row permutation is undone, the config comes from the `llama.*` metadata, and
each layer is quantized with its own bits (GGUF mixes types per tensor).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import llama

from tandem.common.tokenizer import TokenizerSpec, tokenizer_spec_from_gguf

GGUF_GROUP_SIZE = 32  # Q4_0 / Q4_1 / Q8_0 blocks hold 32 weights

_BLOCK_NAMES = {
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
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def convert_gguf(path: Path) -> tuple[nn.Module, TokenizerSpec, dict[str, Any]]:
    """Read a llama-architecture GGUF into an mlx-lm llama Model without dequantizing."""
    loaded: Any = mx.load(str(path), return_metadata=True)  # its stub says a union
    weights, meta = loaded
    config = _config_from_gguf(meta, weights)
    weights = _rename_and_unpermute(weights, config)
    if quant := _quantization_config(weights):  # mlx-lm expects no key when unquantized
        config["quantization"] = quant
    return build_llama(config, weights), tokenizer_spec_from_gguf(path), config


def _meta(meta: dict[str, Any], key: str, default: Any = None) -> Any:
    value = meta.get(key, default)
    return value.item() if isinstance(value, mx.array) else value


def _config_from_gguf(meta: dict[str, Any], weights: dict[str, mx.array]) -> dict[str, Any]:
    """mlx-lm llama ModelArgs fields from the GGUF `llama.*` metadata."""
    arch = _meta(meta, "general.architecture")
    if arch != "llama":
        raise ValueError(f"GGUF architecture {arch!r} is not supported (only 'llama')")
    if "rope_freqs.weight" in weights:
        raise ValueError("GGUF with rope_freqs (Llama 3.1 rope scaling) is not supported")
    if _meta(meta, "llama.rope.scaling.type", "none") not in ("none", "linear"):
        raise ValueError("only linear rope scaling is supported")

    def key(name: str, default: Any = None) -> Any:
        return _meta(meta, f"llama.{name}", default)

    n_heads = key("attention.head_count")
    hidden = key("embedding_length")
    config: dict[str, Any] = {
        "model_type": "llama",
        "hidden_size": hidden,
        "num_hidden_layers": key("block_count"),
        "intermediate_size": key("feed_forward_length"),
        "num_attention_heads": n_heads,
        "num_key_value_heads": key("attention.head_count_kv", n_heads),
        "head_dim": key("attention.key_length") or key("rope.dimension_count") or hidden // n_heads,
        "rms_norm_eps": key("attention.layer_norm_rms_epsilon", 1e-5),
        "vocab_size": weights["token_embd.weight"].shape[0],
        "rope_theta": key("rope.freq_base", 10000.0),
        "max_position_embeddings": key("context_length"),
        "tie_word_embeddings": "output.weight" not in weights,
        "attention_bias": "blk.0.attn_q.bias" in weights,
        "mlp_bias": "blk.0.ffn_up.bias" in weights,
    }
    if _meta(meta, "llama.rope.scaling.type") == "linear":
        config["rope_scaling"] = {"type": "linear", "factor": key("rope.scaling.factor")}
    return config


def _rename_and_unpermute(
    weights: dict[str, mx.array], config: dict[str, Any]
) -> dict[str, mx.array]:
    """llama.cpp tensor names -> HF names; Q/K rows back to HF's rope layout."""
    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    out: dict[str, mx.array] = {}
    for name, w in weights.items():
        base, suffix = name.rsplit(".", 1)  # weight / bias, or scales / biases if quantized
        parts = base.split(".")
        if parts[0] == "blk" and len(parts) == 3 and parts[2] in _BLOCK_NAMES:
            if parts[2] in heads:
                w = unpermute_rows(w, heads[parts[2]])
            out[f"model.layers.{parts[1]}.{_BLOCK_NAMES[parts[2]]}.{suffix}"] = w
        elif base in _TOP_NAMES:
            out[f"{_TOP_NAMES[base]}.{suffix}"] = w
        else:
            raise ValueError(f"unexpected GGUF tensor {name!r}")
    return out


def unpermute_rows(w: mx.array, n_heads: int) -> mx.array:
    """Undo convert_hf_to_gguf's `permute` on output rows.

    llama.cpp interleaves each head's two rope halves (rows [h, 2, d/2] -> [h, d/2, 2]).
    Only whole rows move, so a quantized weight and its scales and biases (all with
    one row per output) are reordered alike and the packed values stay valid.
    """
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _quantization_config(weights: dict[str, mx.array]) -> dict[str, Any]:
    """mlx-lm's `quantization` entry: the most common bits, plus per-layer exceptions.

    GGUF mixes types per tensor (SmolLM2: Q8_0 embeddings, Q4_1 layers).
    """
    per_layer: dict[str, dict[str, int]] = {}
    for name, scales in weights.items():
        if name.endswith(".scales"):
            layer = name[: -len(".scales")]
            in_dims = scales.shape[-1] * GGUF_GROUP_SIZE
            bits = weights[f"{layer}.weight"].shape[-1] * 32 // in_dims
            per_layer[layer] = {"group_size": GGUF_GROUP_SIZE, "bits": bits}
    if not per_layer:
        return {}
    common_bits = Counter(q["bits"] for q in per_layer.values()).most_common(1)[0][0]
    quant: dict[str, Any] = {"group_size": GGUF_GROUP_SIZE, "bits": common_bits}
    quant.update({k: q for k, q in per_layer.items() if q["bits"] != common_bits})
    return quant


def build_llama(config: dict[str, Any], weights: dict[str, mx.array]) -> nn.Module:
    """Instantiate mlx-lm's llama, quantize the layers that have scales, load `weights`."""
    model = llama.Model(llama.ModelArgs.from_dict(config))
    quant = config.get("quantization") or {}
    if quant:

        def predicate(path: str, module: nn.Module) -> bool | dict[str, int]:
            if path in quant:
                return quant[path]
            return hasattr(module, "to_quantized") and f"{path}.scales" in weights

        nn.quantize(model, quant["group_size"], quant["bits"], class_predicate=predicate)
    model.load_weights(list(weights.items()), strict=True)
    mx.eval(model.parameters())
    model.eval()
    return model
