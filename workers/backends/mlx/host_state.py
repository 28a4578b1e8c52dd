"""MLX's host-RAM tier: a prefix-cache entry's KV copied to host memory and back.

On a CUDA GPU a ``CachedKV``'s arrays live in GPU memory; the prefix cache's host
tier (workers/host_cache.py) keeps an entry it evicts from the device as numpy
copies in host RAM and restores them as MLX arrays on a hit. (On Metal and on a CPU
the arrays already sit in host memory: workers/memory.py gives those no host tier.)
numpy has no bfloat16: such arrays travel as their 16 bits (a view, not a cast).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import mlx.core as mx
import numpy as np

if TYPE_CHECKING:
    from tandem.workers.backends.mlx.backend import CachedKV, MlxBackend


@dataclass
class HostKV:
    """One entry's KV in host RAM: (keys, values) per layer, and their MLX dtype."""

    layers: list[tuple[np.ndarray, np.ndarray]]
    n_tokens: int
    dtype: mx.Dtype

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self.layers)


def save(handle: CachedKV) -> HostKV | None:
    """Host copies of ``handle``'s arrays (None for a freed or empty handle)."""
    if not handle.layers:
        return None
    dtype = handle.layers[0][0].dtype
    raw = mx.uint16 if dtype == mx.bfloat16 else dtype
    layers = [(np.array(k.view(raw)), np.array(v.view(raw))) for k, v in handle.layers]
    return HostKV(layers, handle.n_tokens, dtype)


def restore(backend: MlxBackend, state: HostKV) -> CachedKV:
    """``state`` as MLX arrays on ``backend``'s device again (counted as held there)."""
    from tandem.workers.backends.mlx.backend import CachedKV

    with mx.stream(backend._stream):
        layers = [(mx.array(k).view(state.dtype), mx.array(v).view(state.dtype))
                  for k, v in state.layers]  # fmt: skip
        mx.eval(layers)
    backend._held_tokens += state.n_tokens
    return CachedKV(layers, state.n_tokens)
