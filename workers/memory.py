"""How much KV a worker keeps: its device's memory, a fraction of it, in tokens.

A token's KV is a key and a value vector per layer per KV head, so its bytes follow
from the model's shape: 2 x n_layer x n_kv_head x head_dim x bytes per value (f16:
2). The embedded SmolLM2-135M holds 23,040 bytes a token (llama.cpp's saved state
of a 512-token sequence measured 23,053 a token), 46,603 tokens per GiB.

Which memory a worker sizes from (``device_memory``):

- a CPU worker: host RAM available now (psutil);
- a CUDA GPU: its free memory (nvidia-smi), less the weights still to load and
  the KV of a full batch at the longest context (``batch_kv_bytes``), with a tenth
  of the GPU left as headroom (GPU_HEADROOM_FRAC) for activations, the CUDA
  context, cuBLAS workspaces and the allocator's cached buffers;
- Metal: MLX's recommended working set, less the same.

The host tier (workers/host_cache.py) takes its own share of host RAM.

Sane limits where memory is small: a worker takes ``frac`` of what is available
now (not of the total), never leaves less than ``RESERVE_BYTES`` of it for everyone
else, and a CPU worker's default shares are small and capped (the box tests run on
has 24 GiB and other workers on it), since llama.cpp allocates its whole context
at start. A flag gives the fraction or an absolute size (``--cache-mem``).
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

GIB = 1 << 30
RESERVE_BYTES = 2 * GIB  # left to the system and the other processes, whatever the fraction
GPU_HEADROOM_FRAC = 0.1  # of a GPU's total memory, never given to the prefix cache
# Default fractions of the available memory: a GPU is the worker's own; host RAM is shared.
DEVICE_FRAC = {"gpu": 0.8, "cpu": 0.05}
HOST_FRAC = 0.1
CPU_DEVICE_CAP_BYTES = 1 * GIB  # a CPU worker's default KV pool (preallocated by llama.cpp)
HOST_CAP_BYTES = 8 * GIB  # the default host tier, at most
EMBEDDED_KV_BYTES = 23_040  # SmolLM2-135M: 2 x 30 layers x 3 KV heads x 64 x 2 bytes


@dataclass(frozen=True)
class KVShape:
    """What one token's KV is made of."""

    n_layer: int
    n_kv_head: int
    head_dim: int
    bytes_per_value: int = 2  # f16 KV, llama.cpp's and mlx-lm's default

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.n_layer * self.n_kv_head * self.head_dim * self.bytes_per_value

    @classmethod
    def from_gguf(cls, path: str | Path) -> KVShape:
        """From a GGUF header's ``<arch>.block_count``, head counts and widths."""
        from tandem.common.gguf_file import read_gguf_header

        kv = read_gguf_header(path).kv
        arch = kv.get("general.architecture", "llama")
        heads = int(kv[f"{arch}.attention.head_count"])
        kv_heads = kv.get(f"{arch}.attention.head_count_kv", heads)
        head_dim = kv.get(f"{arch}.attention.key_length")
        if head_dim is None:
            head_dim = int(kv[f"{arch}.embedding_length"]) // heads
        return cls(int(kv[f"{arch}.block_count"]), int(kv_heads), int(head_dim))

    @classmethod
    def from_hf_config(cls, config: dict[str, Any]) -> KVShape:
        """From a Hugging Face ``config.json`` (an MLX model folder)."""
        heads = int(config["num_attention_heads"])
        head_dim = config.get("head_dim") or int(config["hidden_size"]) // heads
        kv_heads = int(config.get("num_key_value_heads") or heads)
        return cls(int(config["num_hidden_layers"]), kv_heads, int(head_dim))


def kv_bytes_per_token(model: str | Path) -> int:
    """KV bytes per token of the model at ``model`` (GGUF file or model folder);
    the embedded model's when its shape cannot be read."""
    path = Path(model)
    try:
        if path.is_dir():
            import json

            config = json.loads((path / "config.json").read_text())
            return KVShape.from_hf_config(config).bytes_per_token
        return KVShape.from_gguf(path).bytes_per_token
    except (OSError, KeyError, ValueError, TypeError) as exc:
        log.warning("KV shape of %s unknown (%s): assuming %d bytes a token", model, exc,
                    EMBEDDED_KV_BYTES)  # fmt: skip
        return EMBEDDED_KV_BYTES


@dataclass(frozen=True)
class Memory:
    """Memory a worker may size from: ``available`` now, of ``total``; where it was read."""

    total_bytes: int
    available_bytes: int
    source: str


def host_memory() -> Memory:
    import psutil

    vm = psutil.virtual_memory()
    return Memory(int(vm.total), int(vm.available), "host RAM (psutil)")


def device_memory(device: str) -> Memory:
    """The memory ``device`` ("cpu", "gpu-cuda", "gpu-metal", "gpu") keeps KV in; a GPU
    whose memory cannot be read falls back to host RAM (said in ``source``)."""
    if device.startswith("gpu"):
        got = _metal_memory() if "metal" in device else _cuda_memory()
        if got is not None:
            return got
        log.warning("cannot read %s memory: sizing the KV from host RAM", device)
    return host_memory()


def _cuda_memory() -> Memory | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=memory.total,memory.free", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout  # fmt: skip
        total_mib, free_mib = (int(x) for x in re.split(r"[,\s]+", out.strip())[:2])
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return Memory(total_mib << 20, free_mib << 20, "GPU 0 free memory (nvidia-smi)")


def _metal_memory() -> Memory | None:
    try:
        import mlx.core as mx

        info = mx.device_info()
        total = int(info["memory_size"])
        working_set = int(info.get("max_recommended_working_set_size", total))
    except (ImportError, KeyError, TypeError, ValueError, RuntimeError):
        return None
    return Memory(total, working_set, "Metal recommended working set (mlx)")


def share(
    memory: Memory,
    frac: float,
    cap_bytes: int | None = None,
    less: int = 0,
    reserve: int = RESERVE_BYTES,
) -> int:
    """``frac`` of what ``memory`` has available (less ``less`` bytes, e.g. weights still
    to load), at most ``cap_bytes``, leaving ``reserve`` bytes of it untouched."""
    if not 0 <= frac <= 1:
        raise ValueError(f"a memory fraction must be in [0, 1], not {frac}")
    free = max(0, memory.available_bytes - less)
    out = min(int(frac * free), max(0, free - reserve))
    return min(out, cap_bytes) if cap_bytes is not None else out


def parse_bytes(text: str) -> int:
    """``"512MiB"``, ``"2GiB"``, ``"1.5G"``, ``"1000000"`` -> bytes; ValueError otherwise."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(i?b?)\s*", text.lower())
    if not m:
        raise ValueError(f"not a size: {text!r} (e.g. 512MiB, 2GiB)")
    scale = 1 << (10 * " kmgt".index(m.group(2) or " "))
    return int(float(m.group(1)) * scale)


# llama.cpp's device tiers by default. Every decode step computes attention over every
# cell its unified pool holds (masked), so a full prefix cache slows every step of every
# request: on the H200 (studies/held_cells.py, docs/results/h200/prices-hold/), a
# SmolLM2 decode step after 512-token rows took 3.1-3.5x as long with 262,144 cells held
# (the GPU default before) as with none, +22-27 % with 16,384, and on its 10-thread CPU
# +6-79 % with 4,096 (the CPU default before): what reused workers' warm caches cost,
# and what start-up prices, measured in an empty pool, missed. The host tier keeps what
# leaves the device, and a hit there is a copy (on a CPU 2,000-6,600x faster than a prefill).
LLAMA_CPU_DEVICE_TOKENS = 1024  # llama.cpp on a CPU: see ``plan``
LLAMA_GPU_DEVICE_TOKENS = 8192  # full, +15-20 % a step on the H200 (4,096: +5-9 %)
LLAMA_MAX_SEQ = 256  # llama.cpp refuses a context with more sequences (measured, 0.3.36)


def llama_sequences(max_active: int, cache_entries: int | None, batch: int) -> int:
    """llama.cpp's ``n_seq_max``: one per active request, one per cache entry, one to
    restore into; at most LLAMA_MAX_SEQ, and at most ``batch`` (n_batch: a context
    with more sequences than outputs in a batch aborts the process at creation,
    GGML_ASSERT n_outputs_max). So its device tier holds this less max_active + 1."""
    most = min(LLAMA_MAX_SEQ, batch)
    wanted = max_active + 1 + (cache_entries if cache_entries is not None else most)
    if max_active + 1 > most:
        raise ValueError(f"llama.cpp serves at most {most - 1} active requests here")
    return min(wanted, most)


@dataclass(frozen=True)
class CachePlan:
    """A worker's prefix cache sizes, in tokens of its model's KV, and where they came from."""

    bytes_per_token: int
    device_tokens: int
    host_tokens: int
    device_source: str  # the memory the device tier was sized from, or "--cache-tokens" etc.
    host_source: str

    def describe(self) -> str:
        gib = self.bytes_per_token / GIB
        return (f"prefix cache: {self.device_tokens} tokens on the device "
                f"({self.device_tokens * gib:.2f} GiB, {self.device_source}), "
                f"{self.host_tokens} in host RAM ({self.host_tokens * gib:.2f} GiB, "
                f"{self.host_source}); {self.bytes_per_token} bytes a token")  # fmt: skip


def plan(
    *,
    backend: str,
    device: str,
    bytes_per_token: int,
    weights_bytes: int = 0,
    cache_tokens: int | None = None,
    cache_mem_frac: float | None = None,
    cache_mem: int | None = None,
    host_cache_mem_frac: float | None = None,
    host_cache_mem: int | None = None,
    device_mem: Memory | None = None,
    host_mem: Memory | None = None,
    batch_kv_bytes: int = 0,
) -> CachePlan:
    """The cache sizes of a worker of ``backend`` on ``device`` ("cpu", "gpu-cuda", ...).

    Device tier: ``cache_tokens``, else ``cache_mem`` bytes, else ``cache_mem_frac``
    (default ``DEVICE_FRAC``) of the device's available memory (less the weights on
    a GPU). A CPU's default is capped at CPU_DEVICE_CAP_BYTES; llama.cpp on a CPU
    keeps LLAMA_CPU_DEVICE_TOKENS by default: it allocates its whole pool at start,
    and every cell the pool holds is attended over (masked) by every decode step
    (see LLAMA_CPU_DEVICE_TOKENS), while its host tier holds the rest at no decode
    cost and restores 2,000-6,600x faster than it prefills.
    Host tier (llama.cpp, and MLX on a CUDA GPU): ``host_cache_mem``
    bytes, else ``host_cache_mem_frac`` (default HOST_FRAC, capped at HOST_CAP_BYTES).
    ``device_mem`` / ``host_mem``: the memories to size from (the twin's modelled
    devices); None: read from this machine. ``batch_kv_bytes``: the KV the active
    requests may hold, which a GPU's share leaves free besides the weights and
    GPU_HEADROOM_FRAC of its memory; llama.cpp's GPU pool is capped at
    LLAMA_GPU_DEVICE_TOKENS.
    """
    if bytes_per_token < 1:
        raise ValueError("bytes_per_token must be >= 1")
    gpu = device.startswith("gpu")
    if cache_tokens is not None:
        device_tokens, device_source = cache_tokens, "--cache-tokens"
    elif cache_mem is not None:
        device_tokens, device_source = cache_mem // bytes_per_token, "--cache-mem"
    elif backend == "llama.cpp" and not gpu and cache_mem_frac is None:
        device_tokens, device_source = LLAMA_CPU_DEVICE_TOKENS, "llama.cpp CPU default"
    else:
        device_tokens, device_source = _device_share(
            backend, device, bytes_per_token, weights_bytes + batch_kv_bytes, cache_mem_frac,
            device_mem,
        )  # fmt: skip
    # A host tier where leaving the device frees something: llama.cpp's pool, a CUDA
    # GPU's memory (MLX copies to host RAM). On Metal or a CPU, MLX's arrays already
    # sit in host memory; a sim worker holds no KV.
    if backend == "sim" or (backend == "mlx" and device != "gpu-cuda"):
        return CachePlan(bytes_per_token, device_tokens, 0, device_source, "none")
    if host_cache_mem is not None:
        host_bytes, host_source = host_cache_mem, "--host-cache-mem"
    else:
        frac = host_cache_mem_frac if host_cache_mem_frac is not None else HOST_FRAC
        cap = None if host_cache_mem_frac is not None else HOST_CAP_BYTES
        mem = host_mem or host_memory()
        host_bytes, host_source = share(mem, frac, cap), f"{frac:g} of {mem.source}"
    return CachePlan(bytes_per_token, device_tokens, host_bytes // bytes_per_token,
                     device_source, host_source)  # fmt: skip


def _device_share(
    backend: str,
    device: str,
    bytes_per_token: int,
    less: int,
    frac: float | None,
    mem: Memory | None,
) -> tuple[int, str]:
    """(tokens, where from) of a device tier sized from memory: ``frac`` (default
    DEVICE_FRAC) of what is available, less ``less`` bytes on a GPU (weights, the
    batch's KV) and its headroom; a CPU's default capped at CPU_DEVICE_CAP_BYTES."""
    gpu = device.startswith("gpu")
    mem = mem or device_memory(device)
    asked = frac is not None
    frac = frac if frac is not None else DEVICE_FRAC["gpu" if gpu else "cpu"]
    if not gpu:
        got = share(mem, frac, None if asked else CPU_DEVICE_CAP_BYTES)
        return got // bytes_per_token, f"{frac:g} of {mem.source}"
    reserve = max(RESERVE_BYTES, int(GPU_HEADROOM_FRAC * mem.total_bytes))
    tokens = share(mem, frac, less=less, reserve=reserve) // bytes_per_token
    source = (f"{frac:g} of {mem.source} after weights and the batch's KV, "
              f"headroom {reserve / GIB:.1f} GiB")  # fmt: skip
    if backend == "llama.cpp" and not asked and tokens > LLAMA_GPU_DEVICE_TOKENS:
        return LLAMA_GPU_DEVICE_TOKENS, f"llama.cpp GPU default (memory allowed {tokens})"
    return tokens, source


@dataclass(frozen=True)
class ModelledMemory:
    """A simulated device's memory (a sim profile's ``memory`` object), so the twin
    sizes its caches as the real worker would: the backend it models, its device
    label, the GiB free for KV on the device and in host RAM, and how fast a saved
    sequence is restored from host RAM (tokens a second; None: no host tier)."""

    backend: str
    device: str
    device_gib: float
    host_gib: float
    restore_tok_s: float | None = None

    def __post_init__(self) -> None:
        if self.backend not in ("llama.cpp", "mlx"):
            raise ValueError(f"memory.backend must be llama.cpp or mlx, not {self.backend!r}")
        if not (self.device_gib > 0 and self.host_gib > 0):
            raise ValueError("memory.device_gib and memory.host_gib must be > 0")
        if self.restore_tok_s is not None and not self.restore_tok_s > 0:
            raise ValueError("memory.restore_tok_s must be > 0")

    @classmethod
    def from_json(cls, doc: Any) -> ModelledMemory:
        if not isinstance(doc, dict):
            raise ValueError("a profile's memory must be an object")
        known = {"backend", "device", "device_gib", "host_gib", "restore_tok_s"}
        unknown = sorted(set(doc) - known)
        if unknown:
            raise ValueError(f"memory: unknown key(s) {unknown}")
        try:
            restore = doc.get("restore_tok_s")
            return cls(str(doc["backend"]), str(doc["device"]), float(doc["device_gib"]),
                       float(doc["host_gib"]), float(restore) if restore else None)  # fmt: skip
        except (KeyError, TypeError) as exc:
            raise ValueError(f"memory: missing or bad field {exc}") from None

    def memories(self) -> tuple[Memory, Memory]:
        """(device, host) as ``plan`` takes them: all of it available."""
        dev, host = int(self.device_gib * GIB), int(self.host_gib * GIB)
        return Memory(dev, dev, f"{self.device_gib:g} GiB modelled"), Memory(
            host, host, f"{self.host_gib:g} GiB host modelled"
        )
