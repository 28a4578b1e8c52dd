"""A worker process's configuration: one frozen dataclass, validated on creation."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

from tandem.common.affinity import usable_cores
from tandem.common.nodes import checked_node, default_node
from tandem.workers.prefix_cache import POLICIES

# The backends by name; workers/backends/__init__.py maps each to its class (and imports
# this module: the names live here so that the config needs nothing of the registry).
BACKENDS = ("llama.cpp", "mlx", "sim")
WARMUP = ("auto", "quick", "on", "off")
WEIGHTS = ("auto", "as-is", "q8_0")  # workers/backends/llama_weights.py
DEFAULT_PREFILL_TOK_S, DEFAULT_DECODE_TOK_S = 200.0, 50.0  # no profile, no flags: a guess


def default_threads(cpus: tuple[int, ...] | None = None) -> int:
    """llama.cpp threads for a worker not told how many: all of ``cpus`` when it is
    pinned to them, else the cores it may use less one, at least 1.

    The core left over is for whoever shares the machine (the router, the worker's own
    I/O thread, a gateway): llama.cpp's threads meet at a barrier every operation, so
    one of them descheduled stalls the rest. On a 2-core machine running the router,
    2 threads served 0.14-0.17x the burst tokens/s of 1 under load, and 1.3-1.7x when
    it was idle (docs/results/startup.md). ``tandem serve`` leaves one more core, for
    its gateway (launcher/plan.py)."""
    if cpus:
        return len(cpus)
    return max(1, usable_cores() - 1)


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """How one worker's engine schedules: slots, step budget, prefix cache, heartbeats."""

    max_active: int = 4
    step_tokens: int = 256  # per-step token budget: decode tokens first, then prefill chunks
    # While requests decode, a step with prompt chunks lasts about this many decode steps
    # (from the live step model): a stream waits at most that long for another's
    # prompt. 0: the token budget alone (a 256-token chunk held streams ~2.7 s on 2 cores).
    step_budget_x: float = 3.0
    min_chunk_tokens: int = 16  # a time-budgeted chunk is never smaller: prompts progress
    block_size: int = 16
    # Prefix cache budget (KV tokens kept after requests end) on the device; None: a
    # worker sizes it from memory at start (workers/memory.py), a bare engine keeps 4096.
    cache_tokens: int | None = None
    cache_entries: int | None = None  # None: as many as the backend can hold
    host_cache_tokens: int = 0  # the host-RAM tier (workers/host_cache.py); 0: none
    cache_policy: str = "value"  # eviction: value | lru (workers/prefix_cache.py)
    kv_bytes_per_token: int = 0  # the model's (workers/memory.py), for heartbeats; 0: unknown
    heartbeat_s: float = 0.5
    max_tokens_limit: int = 4096
    full_resync_s: float = 30.0  # a full block listing this often, whatever the deltas said
    steps_every_s: float = 1.0  # the step-time model rides a heartbeat at most this often

    def __post_init__(self) -> None:
        if self.max_active < 1:
            raise ValueError("max_active must be >= 1")
        if self.step_tokens < self.max_active:
            raise ValueError("step_tokens must be >= max_active (one decode token each)")
        if self.step_budget_x != 0 and not 1 < self.step_budget_x <= 1000:
            raise ValueError("step_budget_x must be 0 (off) or in (1, 1000] decode steps")
        if self.min_chunk_tokens < 1:
            raise ValueError("min_chunk_tokens must be >= 1")
        if self.block_size < 1 or self.heartbeat_s <= 0 or self.steps_every_s <= 0:
            raise ValueError("block_size must be >= 1, heartbeat_s and steps_every_s > 0")
        sizes = (self.cache_tokens, self.cache_entries, self.host_cache_tokens)
        if min(n for n in sizes if n is not None) < 0 or self.max_tokens_limit < 1:
            raise ValueError("cache sizes must be >= 0 and max_tokens_limit >= 1")
        if self.cache_policy not in POLICIES:
            raise ValueError(f"cache_policy must be one of {POLICIES}, not {self.cache_policy!r}")


@dataclass(frozen=True, kw_only=True)
class WorkerConfig:
    """A worker process's settings; `tandem worker`'s options map onto these fields."""

    router: str
    router_file: str | None = None  # follow the address written there (workers/follow.py)
    backend: str = "llama.cpp"
    model: str | None = None  # None: the embedded default model
    worker_id: str | None = None
    device: str = "auto"
    threads: int = 0  # llama.cpp threads; 0: default_threads(cpus)
    n_ctx: int = 8192
    engine: EngineConfig = field(default_factory=EngineConfig)
    prefill_tok_s: float | None = None  # None: from the stored profile, else a default
    decode_tok_s: tuple[float, ...] | None = None
    profile: str | None = None  # sim backend: its device profile file
    cpus: tuple[int, ...] | None = None  # cores this worker (and its threads) may use
    warmup: str = "auto"  # auto | quick | on | off: see ``measurement``
    # A CPU llama.cpp worker's weights: auto (Q8_0 where measured faster and alike),
    # as-is, q8_0 (workers/backends/llama_weights.py).
    weights: str = "auto"
    progress_json: bool = False  # JSON progress lines on stdout (workers/startup.py)
    keep_profile: bool = False  # store the start-up measurement where no profile is stored
    keys: str | None = None  # CURVE keys folder (common/auth.py); None: TANDEM_KEYS or none
    # The prefix cache's memory (workers/memory.py): a fraction of the device's available
    # memory or a size in bytes (None: the device's default), and the host-RAM tier's.
    cache_mem_frac: float | None = None
    cache_mem: int | None = None
    host_cache_mem_frac: float | None = None
    host_cache_mem: int | None = None
    node: str = ""  # the machine, shown in status and /metrics; "": TANDEM_NODE or the host

    def __post_init__(self) -> None:
        object.__setattr__(self, "node", checked_node(self.node) if self.node else default_node())
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, not {self.backend!r}")
        if self.threads < 0 or self.n_ctx < 64:
            raise ValueError("threads must be >= 0 (0: the default) and n_ctx >= 64")
        if self.threads == 0:
            object.__setattr__(self, "threads", default_threads(self.cpus))
        if self.prefill_tok_s is not None and self.prefill_tok_s <= 0:
            raise ValueError("prefill_tok_s must be > 0")
        if self.decode_tok_s is not None and (not self.decode_tok_s or min(self.decode_tok_s) <= 0):
            raise ValueError("decode_tok_s must be positive numbers")
        if self.warmup not in WARMUP:
            raise ValueError(f"warmup must be one of {WARMUP}, not {self.warmup!r}")
        if self.weights not in WEIGHTS:
            raise ValueError(f"weights must be one of {WEIGHTS}, not {self.weights!r}")
        for frac in (self.cache_mem_frac, self.host_cache_mem_frac):
            if frac is not None and not 0 <= frac <= 1:
                raise ValueError(f"memory fractions must be in [0, 1], not {frac}")
        if min(self.cache_mem or 0, self.host_cache_mem or 0) < 0:
            raise ValueError("cache memory sizes must be >= 0 bytes")

    def measurement(self, device: str, told: bool) -> str:
        """What the worker measures before it registers: "full" (every batch shape,
        ``workers.profiler.warm_up``), "quick" (a few steps, seconds) or "none".

        auto: MLX on a GPU measures in full (its first shapes compile kernels, which
        serving must not pay: 90-180 s on a fresh H200); a simulated device nothing
        (its profile is its definition); any other device, llama.cpp on a GPU too
        (its kernels are compiled into the build), nothing when ``told`` (the rate
        flags or a stored profile price it: it registers at once and its live steps
        correct that), else quick.
        """
        if self.warmup != "auto":
            return {"on": "full", "quick": "quick", "off": "none"}[self.warmup]
        if device.startswith("sim"):
            return "none"
        if device.startswith("gpu") and self.backend == "mlx":
            return "full"
        return "none" if told else "quick"

    def resolved_id(self, device: str) -> str:
        return self.worker_id or f"{device}-{socket.gethostname()}-{os.getpid()}"
