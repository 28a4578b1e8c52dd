"""The twin's prefix caches: sized from the modelled memory, spec keys honoured or refused."""

from __future__ import annotations

import pytest

from tandem.bench.spec import parse_worker
from tandem.twin.cache import WEIGHTS_BYTES, CacheSpec
from tandem.twin.device import TwinLlamaDevice, twin_device
from tandem.twin.sim import twin_spec
from tandem.workers.device_model import SimProfile
from tandem.workers.engine import Engine
from tandem.workers.memory import GIB, HOST_CAP_BYTES, LLAMA_CPU_DEVICE_TOKENS

KV = 23_040


def spec_of(text: str):
    return twin_spec(parse_worker(text, set()), max_active=4)


@pytest.mark.parametrize("key", ["threads=4", "cache_size=9", "warmup=on", "model=x.gguf"])
def test_a_key_the_twin_does_not_model_is_an_error(key):
    with pytest.raises(ValueError, match="does not model"):
        spec_of(f"sim:h200-gpu:{key}")


def test_bad_cache_values_are_errors_naming_the_worker():
    for bad in ("cache_tokens=lots", "cache_mem=huge", "cache_policy=random"):
        with pytest.raises(ValueError, match="sim:h200-gpu"):
            spec_of(f"sim:h200-gpu:{bad}")


def test_cache_keys_are_honoured():
    s = spec_of("sim:h200-gpu:cache_tokens=1000:cache_entries=7:cache_policy=lru:n_ctx=4096")
    cfg = s.engine()
    assert (cfg.cache_tokens, cfg.cache_entries, cfg.cache_policy) == (1000, 7, "lru")
    assert s.n_ctx == 4096
    s = spec_of("sim:h200-cpu:cache_mem=1GiB:host_cache_mem=2GiB")
    assert s.engine().cache_tokens == GIB // KV
    assert s.engine().host_cache_tokens == 2 * GIB // KV


def test_the_default_sizes_charge_the_modelled_memory_per_token():
    gpu = CacheSpec().plan(SimProfile.load("h200-gpu"))
    assert gpu is not None and gpu.bytes_per_token == KV
    assert gpu.device_tokens == int(0.8 * (139 * GIB - WEIGHTS_BYTES)) // KV  # ~5.2M tokens
    cpu = CacheSpec().plan(SimProfile.load("h200-cpu"))
    assert cpu is not None and cpu.device_tokens == LLAMA_CPU_DEVICE_TOKENS
    assert cpu.host_tokens == HOST_CAP_BYTES // KV  # 0.1 of 128 GiB, capped at 8 GiB


def test_a_llama_device_has_sequence_ids_and_restores_in_device_time():
    s = spec_of("sim:h200-cpu")

    class Owner:
        now = 0.0

    dev = twin_device(s.profile, Owner(), s.engine())
    assert isinstance(dev, TwinLlamaDevice)
    assert dev.max_cache_entries == 256 - 4 - 1  # llama.cpp's 256 sequences less the active
    engine = Engine(dev, s.engine(), lambda m: None, "w", clock=lambda: 0.0)
    assert engine.cache.capacity["host"] > 0, "a host tier behind the device"
    handle = dev.restore(27_000)
    assert dev.held_tokens(handle) == 27_000
    assert dev.owner.now == pytest.approx(27_000 / 270_000)
    gpu = spec_of("sim:h200-gpu")
    assert not hasattr(twin_device(gpu.profile, Owner(), gpu.engine()), "save")


@pytest.mark.parametrize("name", ["h200-gpu", "gpu-m2", "h200-cpu"])
def test_a_sim_worker_process_sizes_its_device_tier_as_the_twin_does(name):
    """From the memory its profile models, not this machine's: a sim worker and the
    twin's worker on one profile keep the same device tier (within the weights'
    rounding); the process keeps no host tier (its backend saves no states)."""
    from tandem.common.model_files import default_model_path
    from tandem.workers.config import WorkerConfig
    from tandem.workers.host_cache import cache_plan

    cfg = WorkerConfig(router="tcp://x:1", backend="sim", profile=name)
    live = cache_plan(cfg, default_model_path(), "cpu")
    twin = CacheSpec(kv_bytes=live.bytes_per_token).plan(SimProfile.load(name))
    assert twin is not None
    assert live.device_tokens == pytest.approx(twin.device_tokens, rel=0.01)
    assert "modelled" in live.device_source or live.device_source == twin.device_source
    assert live.host_tokens == 0


def test_mlx_on_a_cuda_gpu_has_a_host_tier_where_its_profile_gives_a_restore_rate():
    """MLX on CUDA copies evicted arrays to host RAM (workers/backends/mlx/host_state.py):
    the twin models that tier once the profile says how fast a restore is; on Metal
    (unified memory) there is no tier to restore from."""
    from dataclasses import replace

    from tandem.twin.device import TwinHostDevice
    from tandem.workers.config import EngineConfig

    class Owner:
        now = 0.0

    base = SimProfile.load("h200-gpu")
    assert base.memory is not None and base.memory.restore_tok_s is None  # not measured yet
    cuda = replace(base, memory=replace(base.memory, restore_tok_s=2_000_000.0))
    engine_cfg = EngineConfig(max_active=4, **CacheSpec().engine_fields(cuda))
    dev = twin_device(cuda, Owner(), engine_cfg)
    assert isinstance(dev, TwinHostDevice) and not isinstance(dev, TwinLlamaDevice)
    engine = Engine(dev, engine_cfg, lambda m: None, "w", clock=lambda: 0.0)
    assert engine.cache.capacity["host"] > 0
    handle = dev.restore(40_000)
    assert dev.held_tokens(handle) == 40_000 and dev.save(handle) == 40_000
    assert dev.owner.now == pytest.approx(40_000 / 2_000_000)
    metal = replace(base, memory=replace(cuda.memory, device="gpu-metal"))
    assert not hasattr(twin_device(metal, Owner(), engine_cfg), "save")
