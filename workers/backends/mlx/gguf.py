"""GGUF -> mlx-lm Model for the families in `arch/`, quantized blocks kept where MLX can.

`mx.load` reads Q4_0 / Q4_1 / Q8_0 tensors straight into MLX quantized arrays
(group size 32), kept as they are. K-quants (Q2_K..Q6_K) and the other llama.cpp
types arrive dequantized to float16; they are re-quantized to MLX's affine format
with the bits of their GGUF type (Q4_K -> 4-bit, group 32), so memory stays near
the file's size (docs/MLX.md: the cost in NLL). Then each family renames tensors
to HF names, fixes layouts, and reads its config from the `<arch>.*` metadata.
"""

from __future__ import annotations

import importlib
from collections import Counter
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from tandem.common.gguf_file import read_gguf_header
from tandem.common.tokenizer import TokenizerSpec, tokenizer_spec_from_gguf
from tandem.workers.backends.mlx.arch import GgufMetadata, family_of, finish_model

GGUF_GROUP_SIZE = 32  # Q4_0 / Q4_1 / Q8_0 blocks hold 32 weights
# ggml type id -> MLX bits for types mx.load dequantizes (K-quants, Q5_0/Q5_1, IQ4).
REQUANT_BITS = {6: 5, 7: 5, 10: 2, 11: 3, 12: 4, 13: 5, 14: 6, 20: 4, 23: 4}


def convert_gguf(path: Path) -> tuple[nn.Module, TokenizerSpec, dict[str, Any]]:
    """Read a GGUF of a supported family into its mlx-lm Model."""
    loaded: Any = mx.load(str(path), return_metadata=True)  # its stub says a union
    weights, raw_meta = loaded
    meta = GgufMetadata(raw_meta)
    family = family_of(meta)
    config = family.config(meta, weights)
    weights = requantize(weights, {t.name: t.ggml_type for t in read_gguf_header(path).tensors})
    weights = family.tensors(weights, config)
    if quant := quantization_config(weights):  # mlx-lm expects no key when unquantized
        config["quantization"] = quant
    return build_model(config, weights), tokenizer_spec_from_gguf(path), config


def requantize(weights: dict[str, mx.array], types: dict[str, int]) -> dict[str, mx.array]:
    """Quantize to MLX affine the matrices the file stored in a type MLX cannot read."""
    out: dict[str, mx.array] = {}
    for name, w in weights.items():
        bits = REQUANT_BITS.get(types.get(name, -1))
        if bits is None or w.ndim != 2 or w.shape[-1] % GGUF_GROUP_SIZE:
            out[name] = w
            continue
        base = name[: -len(".weight")]
        out[name], out[f"{base}.scales"], out[f"{base}.biases"] = mx.quantize(
            w, group_size=GGUF_GROUP_SIZE, bits=bits
        )
    return out


def quantization_config(weights: dict[str, mx.array]) -> dict[str, Any]:
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


def build_model(config: dict[str, Any], weights: dict[str, mx.array]) -> nn.Module:
    """Instantiate the mlx-lm class, quantize the layers that have scales, load `weights`."""
    module = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    model = module.Model(module.ModelArgs.from_dict(config))
    quant = config.get("quantization") or {}
    if quant:

        def predicate(path: str, layer: nn.Module) -> bool | dict[str, int]:
            if path in quant:
                return quant[path]  # type: ignore[no-any-return]
            return hasattr(layer, "to_quantized") and f"{path}.scales" in weights

        nn.quantize(model, quant["group_size"], quant["bits"], class_predicate=predicate)
    model.load_weights(list(weights.items()), strict=True)
    finish_model(model, config)
    mx.eval(model.parameters())
    model.eval()
    return model
