"""MLX's host-RAM tier: a prefix-cache entry's KV copied to host memory and back.

On a CUDA GPU a ``CachedKV``'s arrays live in GPU memory; the prefix cache's host
tier (workers/host_cache.py) keeps an entry it evicts from the device as numpy
copies in host RAM and restores them as MLX arrays on a hit. (On Metal and on a CPU
the arrays already sit in host memory: workers/memory.py gives those no host tier.)
numpy has no bfloat16: such arrays travel as their 16 bits (a view, not a cast).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from tandem.workers.backends.mlx.batch import KV


@dataclass
class HostKV:
    """One entry's KV in host RAM: (keys, values) per layer, and their MLX dtype."""

    layers: list[tuple[np.ndarray, np.ndarray]]
    n_tokens: int
    dtype: mx.Dtype

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self.layers)


def save(layers: list[KV] | None, n_tokens: int) -> HostKV | None:
    """Host copies of a cache handle's arrays (None for a freed or empty one)."""
    if not layers:
        return None
    dtype = layers[0][0].dtype
    raw = mx.uint16 if dtype == mx.bfloat16 else dtype
    return HostKV([(np.array(k.view(raw)), np.array(v.view(raw))) for k, v in layers],
                  n_tokens, dtype)  # fmt: skip


def load(state: HostKV, stream: Any) -> list[KV]:
    """``state``'s arrays as MLX arrays on ``stream``'s device again."""
    with mx.stream(stream):
        layers = [(mx.array(k).view(state.dtype), mx.array(v).view(state.dtype))
                  for k, v in state.layers]  # fmt: skip
        mx.eval(layers)
    return layers
