"""A worker process's configuration: one frozen dataclass, validated on creation."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

from tandem.workers.backends import BACKENDS
from tandem.workers.engine import EngineConfig

WARMUP = ("auto", "on", "off")
DEFAULT_PREFILL_TOK_S, DEFAULT_DECODE_TOK_S = 200.0, 50.0  # no profile, no flags: a guess


@dataclass(frozen=True)
class WorkerConfig:
    router: str
    backend: str = "llama.cpp"
    model: str | None = None  # None: the embedded default model
    worker_id: str | None = None
    device: str = "auto"
    threads: int = 2
    n_ctx: int = 8192
    engine: EngineConfig = field(default_factory=EngineConfig)
    prefill_tok_s: float | None = None  # None: from the stored profile, else a default
    decode_tok_s: tuple[float, ...] | None = None
    profile: str | None = None  # sim backend: its device profile file
    warmup: str = "auto"  # on | off | auto (on for GPU devices): see workers.profiler.warm_up
    keys: str | None = None  # CURVE keys folder (common/auth.py); None: TANDEM_KEYS or none

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, not {self.backend!r}")
        if self.threads < 1 or self.n_ctx < 64:
            raise ValueError("threads must be >= 1 and n_ctx >= 64")
        if self.prefill_tok_s is not None and self.prefill_tok_s <= 0:
            raise ValueError("prefill_tok_s must be > 0")
        if self.decode_tok_s is not None and (not self.decode_tok_s or min(self.decode_tok_s) <= 0):
            raise ValueError("decode_tok_s must be positive numbers")
        if self.warmup not in WARMUP:
            raise ValueError(f"warmup must be one of {WARMUP}, not {self.warmup!r}")

    def wants_warmup(self, device: str) -> bool:
        """auto: warm GPUs up (per-process kernel compilation); CPUs have nothing to warm."""
        return self.warmup == "on" or (self.warmup == "auto" and device.startswith("gpu"))

    def resolved_id(self, device: str) -> str:
        return self.worker_id or f"{device}-{socket.gethostname()}-{os.getpid()}"
