"""A worker process's configuration: one frozen dataclass, validated on creation."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

from tandem.workers.backends import BACKENDS

WARMUP = ("auto", "quick", "on", "off")
DEFAULT_PREFILL_TOK_S, DEFAULT_DECODE_TOK_S = 200.0, 50.0  # no profile, no flags: a guess


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """How one worker's engine schedules: slots, step budget, prefix cache, heartbeats."""

    max_active: int = 4
    step_tokens: int = 256  # per-step token budget: decode tokens first, then prefill chunks
    block_size: int = 16
    cache_tokens: int = 4096  # prefix cache budget (KV tokens kept after requests end)
    cache_entries: int = 16
    heartbeat_s: float = 0.5
    max_tokens_limit: int = 4096
    full_resync_s: float = 30.0  # a full block listing this often, whatever the deltas said
    steps_every_s: float = 1.0  # the step-time model rides a heartbeat at most this often

    def __post_init__(self) -> None:
        if self.max_active < 1:
            raise ValueError("max_active must be >= 1")
        if self.step_tokens < self.max_active:
            raise ValueError("step_tokens must be >= max_active (one decode token each)")
        if self.block_size < 1 or self.heartbeat_s <= 0 or self.steps_every_s <= 0:
            raise ValueError("block_size must be >= 1, heartbeat_s and steps_every_s > 0")
        if self.cache_tokens < 0 or self.cache_entries < 0 or self.max_tokens_limit < 1:
            raise ValueError("cache_tokens, cache_entries >= 0 and max_tokens_limit >= 1")


@dataclass(frozen=True, kw_only=True)
class WorkerConfig:
    """A worker process's settings; `tandem worker`'s options map onto these fields."""

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
    cpus: tuple[int, ...] | None = None  # cores this worker (and its threads) may use
    warmup: str = "auto"  # auto | quick | on | off: see ``measurement``
    progress_json: bool = False  # JSON progress lines on stdout (workers/startup.py)
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

    def measurement(self, device: str, told: bool) -> str:
        """What the worker measures before it registers: "full" (every batch shape,
        ``workers.profiler.warm_up``), "quick" (a few steps, seconds) or "none".

        auto: a GPU measures in full (its first shapes compile kernels, which serving
        must not pay); a simulated device nothing (its profile is its definition);
        any other device nothing when ``told`` (the rate flags or a stored profile
        price it: it registers at once and its live steps correct that), else quick.
        """
        if self.warmup != "auto":
            return {"on": "full", "quick": "quick", "off": "none"}[self.warmup]
        if device.startswith("sim"):
            return "none"
        if device.startswith("gpu"):
            return "full"
        return "none" if told else "quick"

    def resolved_id(self, device: str) -> str:
        return self.worker_id or f"{device}-{socket.gethostname()}-{os.getpid()}"
