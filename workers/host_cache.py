"""The prefix cache's tiers put together: sizes from memory, the host-RAM tier's restores.

A worker's prefix cache (workers/prefix_cache.py) keeps entries on the DEVICE (KV
cells a new request shares: free to reuse) and, when its backend can save a
sequence's state (llama.cpp: ``llama_state_seq_get_data``), entries evicted from
the device in HOST RAM under their own budget. A request that hits a host entry
has it restored into a fresh sequence (``llama_state_seq_set_data``: a copy, ~1,000x
faster than prefilling the same tokens on this 2-core CPU: docs/results/prefix-cache-memory.md)
instead of prefilled. The heartbeat's cache report says which blocks are on the
device (common/blocks.py) so the router can price a host hit as a restore.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any

from tandem.workers.config import EngineConfig, WorkerConfig
from tandem.workers.device_model import SimProfile
from tandem.workers.memory import CachePlan, ModelledMemory, kv_bytes_per_token, plan
from tandem.workers.prefix_cache import HOST, Match, PrefixCache

log = logging.getLogger(__name__)

DEFAULT_CACHE_TOKENS = 4096  # an engine built without a worker's sizing (tests, tools)


def make_cache(backend: Any, cfg: EngineConfig) -> PrefixCache:
    """The engine's prefix cache: ``cfg``'s sizes within what ``backend`` can hold
    (``max_cache_entries``: llama.cpp's sequence ids), a host tier if it can ``save``."""
    tokens = cfg.cache_tokens if cfg.cache_tokens is not None else DEFAULT_CACHE_TOKENS
    entries = cfg.cache_entries if cfg.cache_entries is not None else tokens // cfg.block_size
    limit = getattr(backend, "max_cache_entries", None)
    if limit is not None:
        entries = min(entries, limit)
    save = getattr(backend, "save", None)
    host = cfg.host_cache_tokens if save is not None and hasattr(backend, "restore") else 0
    cache = PrefixCache(cfg.block_size, tokens, entries, host_capacity_tokens=host,
                        demote=save if host else None, policy=cfg.cache_policy)  # fmt: skip
    cache.kv_bytes_per_token = cfg.kv_bytes_per_token
    return cache


def restored(cache: PrefixCache, backend: Any, match: Match) -> Match:
    """``match`` with its entry on the device: a host entry is restored (the entry is
    pinned by the caller); a restore that fails is a miss, never a failed request."""
    entry = match.entry
    if entry is None or entry.tier != HOST:
        return match
    for handle in cache.evict(len(entry.tokens), entries_needed=1):  # room first
        backend.free(handle)
    t = time.perf_counter()
    try:
        handle = backend.restore(entry.handle)
    except Exception:  # the prefill path still works: serve the request with it
        log.exception("restoring a host-RAM prefix failed; prefilling instead")
        handle = None
    if handle is None:
        return Match(None, 0)
    _note_rate(cache, backend, len(entry.tokens), time.perf_counter() - t)
    for h in cache.promote(entry, handle):
        backend.free(h)
    return match


def _note_rate(cache: PrefixCache, backend: Any, tokens: int, took_s: float) -> None:
    """The restore rate the router prices host hits with: the backend's own (a modelled
    device: the twin stays deterministic), else a running mean of measured restores."""
    told = getattr(backend, "restore_tok_s", None)
    if told:
        cache.restore_tok_s = float(told)
    elif took_s > 0:
        rate = tokens / took_s
        old = cache.restore_tok_s
        cache.restore_tok_s = rate if old == 0 else 0.8 * old + 0.2 * rate


def cache_plan(cfg: WorkerConfig, model: str | Path, device: str) -> CachePlan:
    """The sizes ``cfg`` asks for on ``device``, from ``model``'s KV shape.

    A sim worker whose profile models a device's memory sizes its device tier as a
    worker of the modelled backend on that device would, from the modelled memory
    (as the twin does, twin/cache.py), not from this machine's. It keeps no host
    tier: the sim backend saves no sequence states (the twin models their restores)."""
    path = Path(model)
    weights = path.stat().st_size if path.is_file() else 0
    sizes: dict[str, Any] = {
        "cache_tokens": cfg.engine.cache_tokens,
        "cache_mem_frac": cfg.cache_mem_frac,
        "cache_mem": cfg.cache_mem,
        "host_cache_mem_frac": cfg.host_cache_mem_frac,
        "host_cache_mem": cfg.host_cache_mem,
    }
    modelled = _modelled_memory(cfg)
    per_token = kv_bytes_per_token(path)
    if modelled is None:
        # The active requests' KV at the longest context, which the cache leaves free.
        batch_kv = cfg.engine.max_active * cfg.n_ctx * per_token
        return plan(backend=cfg.backend, device=device, bytes_per_token=per_token,
                    weights_bytes=weights, batch_kv_bytes=batch_kv, **sizes)  # fmt: skip
    device_mem, host_mem = modelled.memories()
    got = plan(backend=modelled.backend, device=modelled.device,
               bytes_per_token=per_token, weights_bytes=weights,
               device_mem=device_mem, host_mem=host_mem, **sizes)  # fmt: skip
    return dataclasses.replace(got, host_tokens=0, host_source="none (a sim worker)")


def _modelled_memory(cfg: WorkerConfig) -> ModelledMemory | None:
    """The memory a sim worker's profile models, if it models one."""
    if cfg.backend != "sim" or not cfg.profile:
        return None
    return SimProfile.load(cfg.profile).memory


def sized(cfg: WorkerConfig, cache: CachePlan) -> WorkerConfig:
    """``cfg`` with its engine's cache sizes set from ``cache``."""
    engine = dataclasses.replace(
        cfg.engine,
        cache_tokens=cache.device_tokens,
        host_cache_tokens=cache.host_tokens,
        kv_bytes_per_token=cache.bytes_per_token,
    )
    return dataclasses.replace(cfg, engine=engine)


def memory_device(cfg: WorkerConfig) -> str:
    """Which memory a worker of ``cfg`` keeps its KV in, before its backend loads."""
    if cfg.backend == "sim" or cfg.device == "cpu":
        return "cpu"
    if cfg.backend == "mlx":
        try:
            import mlx.core as mx
        except ImportError:
            return "cpu"
        if mx.metal.is_available():
            return "gpu-metal"
        return "gpu-cuda" if mx.cuda.is_available() else "cpu"
    if cfg.device.startswith("gpu"):
        import sys

        return "gpu-metal" if sys.platform == "darwin" else "gpu-cuda"
    return "cpu"  # llama.cpp --device auto is the CPU (workers/backends/llama.py)


def size_worker(cfg: WorkerConfig) -> WorkerConfig:
    """``cfg`` with its prefix cache sized from its device's memory (logged)."""
    from tandem.common.model_files import resolve_model

    cache = cache_plan(cfg, resolve_model(cfg.model), memory_device(cfg))
    log.info("%s", cache.describe())
    return sized(cfg, cache)
