"""GGUF architecture -> mlx-lm model class: one module per family.

Each module exports a `Family`: the mlx-lm `model_type` it builds, the config
taken from the GGUF's `<arch>.*` metadata, and the renaming of llama.cpp tensor
names (plus any layout change) to the names that class loads.
"""

from __future__ import annotations

from typing import Any

from tandem.workers.backends.mlx.arch.common import Family, GgufMetadata
from tandem.workers.backends.mlx.arch.gemma import GEMMA, GEMMA2
from tandem.workers.backends.mlx.arch.llama import LLAMA
from tandem.workers.backends.mlx.arch.phi3 import PHI3
from tandem.workers.backends.mlx.arch.qwen2 import QWEN2

# general.architecture -> family. Mistral 7B GGUFs are written as "llama".
FAMILIES: dict[str, Family] = {
    "llama": LLAMA,
    "qwen2": QWEN2,
    "phi3": PHI3,
    "gemma": GEMMA,
    "gemma2": GEMMA2,
}


def family_of(meta: GgufMetadata) -> Family:
    """The family for the file's `general.architecture`; ValueError names the known ones."""
    arch = meta.get("general.architecture")
    if arch not in FAMILIES:
        raise ValueError(
            f"GGUF architecture {arch!r} is not supported by the MLX worker "
            f"(supported: {', '.join(sorted(FAMILIES))}); the llama.cpp worker may load it"
        )
    return FAMILIES[arch]


def finish_model(model: Any, config: dict[str, Any]) -> None:
    """What tandem adds to an mlx-lm model after loading (GGUF or converted folder)."""
    for family in FAMILIES.values():
        if family.model_type == config.get("model_type") and family.finish is not None:
            family.finish(model, config)


__all__ = ["FAMILIES", "Family", "GgufMetadata", "family_of", "finish_model"]
