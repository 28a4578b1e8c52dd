"""The twin's prefix caches, sized as the real worker would size them.

A sim profile's ``memory`` (workers/backends/sim.py, workers/memory.py
``ModelledMemory``) says which backend the simulated device stands for and how much
memory it has; ``CacheSpec`` holds what a ``--worker sim:...`` spec asked for (the
worker's own flags: ``cache_tokens=``, ``cache_mem_frac=``, ...). Together they give
the engine's cache sizes through the worker's own rule (``workers.memory.plan``), with
the embedded model's KV bytes per token charged. A llama.cpp device also gets
llama.cpp's limits: device entries are sequence ids (at most min(256, step tokens)
less the active requests), and a host-RAM tier whose restores cost time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tandem.workers.device_model import SimProfile
from tandem.workers.host_cache import DEFAULT_CACHE_TOKENS
from tandem.workers.memory import EMBEDDED_KV_BYTES, CachePlan, parse_bytes, plan
from tandem.workers.prefix_cache import POLICIES

WEIGHTS_BYTES = 98 << 20  # the embedded model's GGUF: what a GPU loads before its KV


@dataclass(frozen=True, kw_only=True)
class CacheSpec:
    """A twin worker's cache flags (None: the worker's default)."""

    cache_tokens: int | None = None
    cache_entries: int | None = None
    cache_mem_frac: float | None = None
    cache_mem: int | None = None  # bytes
    host_cache_mem_frac: float | None = None
    host_cache_mem: int | None = None
    cache_policy: str = "value"
    kv_bytes: int = EMBEDDED_KV_BYTES  # per token: the model the twin stands for

    def __post_init__(self) -> None:
        if self.cache_policy not in POLICIES:
            raise ValueError(f"cache_policy must be one of {POLICIES}, not {self.cache_policy!r}")
        if min(self.cache_tokens or 0, self.cache_entries or 0, self.kv_bytes) < 0:
            raise ValueError("cache sizes must be >= 0")

    @classmethod
    def from_flags(cls, flags: dict[str, str]) -> CacheSpec:
        """From ``tandem worker`` flags (``--cache-mem 2GiB``); ValueError names a bad one."""
        kw: dict[str, Any] = {}
        for flag, value in flags.items():
            name = flag.removeprefix("--").replace("-", "_")
            try:
                if name in ("cache_tokens", "cache_entries"):
                    kw[name] = int(value)
                elif name.endswith("_frac"):
                    kw[name] = float(value)
                elif name in ("cache_mem", "host_cache_mem"):
                    kw[name] = parse_bytes(value)
                else:
                    kw[name] = value
            except ValueError:
                raise ValueError(f"{flag} {value!r}: not a valid value") from None
        return cls(**kw)

    def plan(self, profile: SimProfile) -> CachePlan | None:
        """The sizes a worker on ``profile``'s device would pick (None: the profile says
        nothing of its memory and no size was asked for)."""
        mem = profile.memory
        if mem is None and self.cache_tokens is None and self.cache_mem is None:
            return None
        device_mem, host_mem = mem.memories() if mem else (None, None)
        return plan(
            backend=mem.backend if mem else "mlx",
            device=mem.device if mem else "gpu",
            bytes_per_token=self.kv_bytes,
            weights_bytes=WEIGHTS_BYTES,
            cache_tokens=self.cache_tokens,
            cache_mem_frac=self.cache_mem_frac,
            cache_mem=self.cache_mem,
            host_cache_mem_frac=self.host_cache_mem_frac,
            host_cache_mem=self.host_cache_mem,
            device_mem=device_mem,
            host_mem=host_mem,
        )

    def engine_fields(self, profile: SimProfile) -> dict[str, Any]:
        """EngineConfig fields for a worker on ``profile``'s device."""
        got = self.plan(profile)
        tokens = got.device_tokens if got else DEFAULT_CACHE_TOKENS
        host = got.host_tokens if got else 0
        return {
            "cache_tokens": tokens,
            "cache_entries": self.cache_entries,
            "host_cache_tokens": host,
            "cache_policy": self.cache_policy,
            "kv_bytes_per_token": self.kv_bytes,
        }
