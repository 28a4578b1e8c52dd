"""GGUF -> mlx-lm Model for the families in `arch/`, quantized blocks kept where MLX can.

`mx.load` reads Q4_0 / Q4_1 / Q8_0 tensors straight into MLX quantized arrays
(group size 32), kept as they are, and K-quants (Q2_K..Q6_K) dequantized to
float16. Files it cannot read at all (Q5_0 / Q5_1 tensors, which llama.cpp's
K-quant mixes use for rows not a multiple of 256, e.g. Qwen2.5-0.5B's 896) are
dequantized tensor by tensor with the `gguf` package instead. Every tensor that
arrives dequantized but was quantized in the file is re-quantized to MLX's affine
8-bit format (group 32): on a Q4_K_M SmolLM2 that keeps top-1 agreement with
llama.cpp at float16's 94 % for 56 % of float16's memory, where re-quantizing at
the file's own bits (4/5/6) costs 12 points of agreement (docs/MLX.md). Then each family renames
tensors to HF names, fixes layouts, and reads its config from `<arch>.*` metadata.
"""

from __future__ import annotations

import importlib
import logging
import math
from collections import Counter
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from tandem.common.gguf_file import read_gguf_header
from tandem.common.tokenizer import TokenizerSpec, tokenizer_spec_from_gguf
from tandem.workers.backends.mlx.arch import GgufMetadata, family_of, finish_model

log = logging.getLogger(__name__)

GGUF_GROUP_SIZE = 32  # Q4_0 / Q4_1 / Q8_0 blocks hold 32 weights
REQUANT_BITS_DEFAULT: int | None = 8  # see the module docstring; None would keep each type's bits
# ggml type id -> MLX bits when a tensor of that type arrives dequantized:
# Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_NL IQ4_XS
REQUANT_BITS = {2: 4, 3: 4, 6: 5, 7: 5, 8: 8, 10: 2, 11: 3, 12: 4, 13: 5, 14: 6, 20: 4, 23: 4}


def convert_gguf(path: Path) -> tuple[nn.Module, TokenizerSpec, dict[str, Any]]:
    """Read a GGUF of a supported family into its mlx-lm Model."""
    weights, raw_meta = load_gguf_tensors(path)
    meta = GgufMetadata(raw_meta)
    family = family_of(meta)
    config = family.config(meta, weights)
    types = {t.name: t.ggml_type for t in read_gguf_header(path).tensors}
    weights = requantize(weights, types, REQUANT_BITS_DEFAULT)
    weights = family.tensors(weights, config)
    if quant := quantization_config(weights):  # mlx-lm expects no key when unquantized
        config["quantization"] = quant
    return build_model(config, weights), tokenizer_spec_from_gguf(path), config


def load_gguf_tensors(path: Path) -> tuple[dict[str, mx.array], dict[str, Any]]:
    """(tensors by GGUF name, metadata): `mx.load`, else the `gguf` package's dequantizer."""
    try:
        loaded: Any = mx.load(str(path), return_metadata=True)  # its stub says a union
        return loaded[0], loaded[1]
    except RuntimeError as e:  # e.g. "[load_gguf] gguf_tensor_to_f16 failed" on Q5_0
        log.info("mx.load cannot read %s (%s): dequantizing with gguf", path.name, e)
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import dequantize

    header = read_gguf_header(path)
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=header.data_start)
    weights: dict[str, mx.array] = {}
    for t in header.tensors:
        qtype = GGMLQuantizationType(t.ggml_type)
        block, block_bytes = GGML_QUANT_SIZES[qtype]
        shape = tuple(reversed(t.shape))  # GGUF lists the fastest dimension first
        row_bytes = shape[-1] // block * block_bytes
        raw = data[t.offset : t.offset + math.prod(shape[:-1]) * row_bytes]
        values = dequantize(raw.reshape(-1, row_bytes), qtype).reshape(shape)
        keep_f32 = qtype == GGMLQuantizationType.F32  # norms and biases stay exact
        weights[t.name] = mx.array(values.astype(np.float32 if keep_f32 else np.float16))
    return weights, header.kv


def requantize(
    weights: dict[str, mx.array], types: dict[str, int], bits: int | None = None
) -> dict[str, mx.array]:
    """Quantize to MLX affine the matrices that arrived dequantized but were quantized
    in the file: with `bits`, or else the bits of their GGUF type."""
    out: dict[str, mx.array] = {}
    for name, w in weights.items():
        file_bits = REQUANT_BITS.get(types.get(name, -1))
        want = file_bits and (bits or file_bits)
        dense = w.dtype in (mx.float16, mx.bfloat16, mx.float32)  # not already packed
        if not want or not dense or w.ndim != 2 or w.shape[-1] % GGUF_GROUP_SIZE:
            out[name] = w
            continue
        base = name[: -len(".weight")]
        out[name], out[f"{base}.scales"], out[f"{base}.biases"] = mx.quantize(
            w, group_size=GGUF_GROUP_SIZE, bits=want
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
                return quant[path]
            return hasattr(layer, "to_quantized") and f"{path}.scales" in weights

        nn.quantize(model, quant["group_size"], quant["bits"], class_predicate=predicate)
    model.load_weights(list(weights.items()), strict=True)
    finish_model(model, config)
    mx.eval(model.parameters())
    model.eval()
    return model
