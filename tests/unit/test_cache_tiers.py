"""The prefix cache's sizes from memory, its eviction by value and its host tier (no model)."""

from __future__ import annotations

import pytest

from tandem.workers import memory
from tandem.workers.config import EngineConfig, WorkerConfig
from tandem.workers.host_cache import make_cache, restored, sized
from tandem.workers.memory import GIB, KVShape, Memory, parse_bytes, plan, share
from tandem.workers.prefix_cache import DEVICE, HOST, PrefixCache

BS = 4


def seq(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


# ------------------------------------------------------------ budgets
def test_kv_bytes_per_token_follow_the_model_shape():
    assert KVShape(30, 3, 64).bytes_per_token == memory.EMBEDDED_KV_BYTES == 23_040
    cfg = {"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
           "hidden_size": 576}  # fmt: skip
    assert KVShape.from_hf_config(cfg).bytes_per_token == 23_040


def test_the_embedded_gguf_reads_as_its_known_shape():
    from tandem.common.model_files import default_model_path

    assert memory.kv_bytes_per_token(default_model_path()) == 23_040


def test_a_share_is_a_fraction_of_what_is_available_and_leaves_a_reserve():
    mem = Memory(total_bytes=64 * GIB, available_bytes=24 * GIB, source="test")
    assert share(mem, 0.5) == 12 * GIB
    assert share(mem, 0.5, cap_bytes=GIB) == GIB
    assert share(mem, 1.0) == 22 * GIB  # RESERVE_BYTES stay free
    assert share(mem, 0.5, less=20 * GIB) == 2 * GIB  # the weights still to load
    assert share(Memory(GIB, GIB, "small"), 0.9) == 0  # less than the reserve: nothing
    with pytest.raises(ValueError):
        share(mem, 1.5)


def test_plan_sizes_each_device_from_its_memory(monkeypatch):
    gpu = Memory(141 * GIB, 100 * GIB, "gpu")
    host = Memory(24 * GIB, 20 * GIB, "host")
    monkeypatch.setattr(memory, "device_memory", lambda d: gpu if d.startswith("gpu") else host)
    monkeypatch.setattr(memory, "host_memory", lambda: host)
    bpt = 23_040
    on_gpu = plan(backend="mlx", device="gpu-cuda", bytes_per_token=bpt, weights_bytes=GIB)
    assert on_gpu.device_tokens == int(0.8 * 99 * GIB) // bpt
    assert on_gpu.host_tokens == 2 * GIB // bpt  # MLX copies to host RAM from a CUDA GPU
    assert plan(backend="mlx", device="gpu-metal", bytes_per_token=bpt).host_tokens == 0
    llama_cpu = plan(backend="llama.cpp", device="cpu", bytes_per_token=bpt)
    assert llama_cpu.device_tokens == memory.LLAMA_CPU_DEVICE_TOKENS
    assert llama_cpu.host_tokens == 2 * GIB // bpt  # 0.1 of 20 GiB
    mlx_cpu = plan(backend="mlx", device="cpu", bytes_per_token=bpt)
    assert mlx_cpu.device_tokens == GIB // bpt  # 0.05 of 20 GiB, capped at 1 GiB
    asked = plan(backend="llama.cpp", device="cpu", bytes_per_token=bpt, cache_mem_frac=0.25,
                 host_cache_mem=3 * GIB)  # fmt: skip
    assert asked.device_tokens == 5 * GIB // bpt and asked.host_tokens == 3 * GIB // bpt
    fixed = plan(backend="sim", device="cpu", bytes_per_token=bpt, cache_tokens=123)
    assert fixed.device_tokens == 123 and fixed.device_source == "--cache-tokens"


def test_sizes_parse_and_bad_ones_are_refused():
    assert parse_bytes("2GiB") == 2 * GIB and parse_bytes("512MiB") == 512 << 20
    assert parse_bytes("1.5g") == 3 * GIB // 2 and parse_bytes("1000") == 1000
    for bad in ("", "lots", "-1GiB", "2PB"):
        with pytest.raises(ValueError):
            parse_bytes(bad)
    with pytest.raises(ValueError):
        WorkerConfig(router="tcp://x:1", cache_mem_frac=1.5)
    with pytest.raises(ValueError):
        EngineConfig(cache_policy="random")


def test_a_plan_sets_the_engine_sizes():
    cfg = WorkerConfig(router="tcp://x:1")
    got = sized(cfg, memory.CachePlan(23_040, 5000, 70_000, "t", "t"))
    assert got.engine.cache_tokens == 5000 and got.engine.host_cache_tokens == 70_000


# ------------------------------------------------------------ eviction by value
def replay(policy: str, capacity: int) -> int:
    """Tokens hit on a stream where a long shared prefix returns now and then among
    many one-off prompts (the shape of a conversation trace)."""
    c = PrefixCache(BS, capacity, 1000, policy=policy)
    shared = seq(32, 10_000)
    hit = 0
    for i in range(60):
        prompt = shared + [i, i] if i % 6 == 0 else seq(12, 1000 * (i + 1))
        hit += c.match(prompt).n_tokens
        c.insert(prompt, f"h{i}")
    return hit


def test_value_eviction_keeps_what_is_shared_where_lru_forgets_it():
    assert replay("value", 48) > replay("lru", 48) > 0


def test_an_idle_entry_ages_out_under_value_eviction():
    c = PrefixCache(BS, 24, 100)
    old, _ = c.insert(seq(16, 500), "old")
    for _ in range(3):
        c.match(seq(17, 500))  # valued: shared by three requests
    for i in range(30):  # then never again, while new prompts keep coming
        c.insert(seq(8, 1000 * (i + 1)), f"n{i}")
        if i == 4:
            assert old.id in c.entries, "valued: it outlives newer one-off entries"
    assert old.id not in c.entries, "credit ages: a once-popular entry goes eventually"


# ------------------------------------------------------------ the host tier
def tiered(host_tokens: int) -> tuple[PrefixCache, list]:
    saved: list = []

    def demote(handle: str) -> str:
        saved.append(handle)
        return f"state:{handle}"

    return PrefixCache(BS, 8, 10, host_capacity_tokens=host_tokens, demote=demote), saved


def test_evicted_entries_move_to_the_host_tier_and_are_matched_there():
    c, saved = tiered(host_tokens=16)
    a, _ = c.insert(seq(8, 100), "a")
    _, freed = c.insert(seq(8, 200), "b")
    assert freed == ["a"] and saved == ["a"], "its device handle is freed once saved"
    assert a.tier == HOST and a.handle == "state:a"
    assert c.held == {DEVICE: 8, HOST: 8}
    assert c.match(seq(9, 100)).entry is a  # still a hit, from host RAM
    report, device = c.log.report(), c.device_log.report()
    assert set(a.hashes) <= set(report.blocks) and not set(a.hashes) & set(device.blocks)


def test_a_host_hit_is_restored_then_shared_like_a_device_hit():
    c, _ = tiered(host_tokens=16)
    a, _ = c.insert(seq(8, 100), "a")
    c.insert(seq(8, 200), "b")

    class Backend:
        freed: list = []

        def restore(self, state: str) -> str:
            return state.replace("state:", "dev:")

        def free(self, handle: str) -> None:
            self.freed.append(handle)

    hit = c.match(seq(9, 100))
    c.pin(hit.entry)
    got = restored(c, Backend(), hit)
    assert got.n_tokens == 8 and a.tier == DEVICE and a.handle == "dev:a"
    assert Backend.freed == ["b"], "room was made on the device first (b moved to host)"
    assert c.held == {DEVICE: 8, HOST: 8} and c.entries[a.id].tier == DEVICE


def test_a_failed_restore_is_a_miss_not_an_error():
    c, _ = tiered(host_tokens=16)
    c.insert(seq(8, 100), "a")
    c.insert(seq(8, 200), "b")

    class Broken:
        def restore(self, state: str) -> None:
            raise RuntimeError("no cells")

        def free(self, handle: str) -> None:
            pass

    hit = c.match(seq(9, 100))
    assert restored(c, Broken(), hit).n_tokens == 0


def test_the_host_tier_has_its_own_budget():
    c, saved = tiered(host_tokens=8)
    for i in range(4):
        c.insert(seq(8, 100 * (i + 1)), f"h{i}")
    assert c.held[DEVICE] <= 8 and c.held[HOST] <= 8 and len(c.entries) == 2
    assert saved == ["h0", "h1", "h2"]


def test_siblings_of_a_shared_prefix_are_saved_once_by_the_last_holder():
    saved: list = []
    c = PrefixCache(BS, 40, 10, host_capacity_tokens=80,
                    demote=lambda h: saved.append(h) or f"state:{h}")  # fmt: skip
    shared = seq(16, 500)
    c.insert(shared + seq(4, 1), "a")  # 5 blocks, 4 of them the shared prefix
    c.insert(shared + seq(4, 2), "b")
    c.insert(seq(20, 100), "c")  # evicts a: b holds 4 of its 5 blocks
    assert saved == [] and c.held[HOST] == 0, "a dropped: a save would buy one block"
    c.insert(seq(20, 200), "d")  # evicts b: now the prefix's last holder
    assert saved == ["b"] and c.held[HOST] == 20
    hit = c.match(shared + seq(4, 3))
    assert hit.n_tokens == 16 and hit.entry is not None and hit.entry.tier == HOST


def test_without_a_saving_backend_there_is_no_host_tier():
    class NoSave:
        pass

    cache = make_cache(NoSave(), EngineConfig(host_cache_tokens=1000))
    assert cache.capacity[HOST] == 0


# ------------------------------------------------------------ the router learns the tiers
def test_heartbeat_reports_say_which_blocks_are_on_the_device():
    from tandem.common.blocks import CacheView

    c, _ = tiered(host_tokens=16)
    view = CacheView()
    a, _ = c.insert(seq(8, 100), "a")
    assert view.apply(c.report()) and view.device is not None
    c.insert(seq(8, 200), "b")  # a moves to host RAM: still held, no longer on the device
    c.restore_tok_s = 250_000.0
    assert view.apply(c.report())
    assert set(a.hashes) <= view.held and not set(a.hashes) & view.device.held
    assert view.restore_tok_s == 250_000.0
    lost = c.report()  # nothing changed: an empty delta for both
    c.match(seq(9, 200))
    c.insert(seq(8, 300), "c")
    skipped = c.report()
    c.insert(seq(8, 400), "d")
    assert view.apply(lost) and not view.apply(c.report()), "a gap in either report is seen"
    assert view.apply(skipped)


def test_no_host_tier_no_device_report():
    c = PrefixCache(BS, 100, 4)
    c.insert(seq(8), "a")
    assert c.report().device is None


def test_host_hits_are_priced_as_restores():
    from types import SimpleNamespace

    from tandem.broker.ledger import PromptBlocks
    from tandem.broker.ledger import tiered as priced
    from tandem.common.blocks import CacheView
    from tandem.common.pricing import tier_cached

    assert tier_cached(100, 100, 200.0, 1000.0) == 100
    assert tier_cached(100, 20, 200.0, 1000.0) == 20 + 64  # 80 restored at a fifth the cost
    assert tier_cached(100, 20, 200.0, 0.0) == 100  # rate unknown: counted whole
    assert tier_cached(100, 20, 2000.0, 1000.0) == 20  # slower than prefill: worth nothing
    c, _ = tiered(host_tokens=16)
    c.insert(seq(8, 100), "a")
    c.insert(seq(8, 200), "b")
    c.restore_tok_s = 400.0
    view = CacheView()
    assert view.apply(c.report())
    w = SimpleNamespace(cache=view)
    chain = PromptBlocks(seq(12, 100)).chain(BS)
    matched = chain.matched_tokens(view.held)
    assert matched == 8 and priced(w, chain, matched, prefill_tok_s=100.0) == 6  # 8 x 3/4
    chain = PromptBlocks(seq(12, 200)).chain(BS)
    assert priced(w, chain, chain.matched_tokens(view.held), prefill_tok_s=100.0) == 8


def test_tiers_are_counted_for_heartbeats_and_shown_by_the_cli():
    from tandem.cli.tables import cache_cell
    from tandem.common.blocks import CacheView

    c, _ = tiered(host_tokens=16)
    c.insert(seq(8, 100), "a")
    c.insert(seq(8, 200), "b")  # a moves to host RAM
    assert c.tiers() == {"cache_tokens": 8, "cache_capacity_tokens": 8,
                         "host_cache_tokens": 8, "host_cache_capacity_tokens": 16}  # fmt: skip
    c.kv_bytes_per_token = 23_040
    view = CacheView()
    assert view.apply(c.report()) and view.host_blocks() == 2
    assert view.tiers == {**c.tiers(), "kv_bytes_per_token": 23_040}
    row = {"cache_tokens": 3000, "cache_capacity_tokens": 5_178_727, "host_cache_tokens": 20_000,
           "host_cache_capacity_tokens": 372_827}  # fmt: skip
    assert cache_cell(row) == "3000/5.2M +20k/373k"
    assert cache_cell({"cache_capacity_tokens": 4096, "cache_tokens": 10}) == "10/4096"
    assert cache_cell({}) == "-"


def test_the_router_shows_the_tiers_in_status_and_metrics(h):
    from tandem.common import protocol as p

    h.add_worker("a", (100.0, [50.0]))
    tiers = p.CacheTiers(3000, 5_000_000, 20_000, 300_000, 23_040)
    cache = p.CacheReport(full=True, seq=1, blocks=[7], tiers=tiers)
    h.workers["a"].send(p.Heartbeat("a", 1, [], [], 0, 8192, cache))
    h.pump()
    registry = h.core.metrics.registry

    def gauge(name: str, tier: str) -> float | None:
        return registry.get_sample_value(
            f"tandem_worker_{name}", {"worker": "a", "node": "", "tier": tier}
        )

    assert gauge("cache_tokens", "device") == 3000 and gauge("cache_tokens", "host") == 20_000
    assert gauge("cache_capacity_tokens", "host") == 300_000
    assert gauge("cache_bytes", "device") == 3000 * 23_040
    row = h.core.workers["a"].describe(True, 0.0)
    assert row["cache_capacity_tokens"] == 5_000_000 and row["host_blocks"] == 0


def test_a_gpu_leaves_the_weights_the_batch_kv_and_headroom_free(monkeypatch):
    """The H200 as serve found it: 141 GiB, 8.5 GiB in use. MLX's budget leaves the
    weights, a full batch's KV and a tenth of the GPU; llama.cpp, which allocates its
    pool at start and keeps ~240 entries at most, takes its capped default."""
    gpu = Memory(141 * GIB, int(132.5 * GIB), "gpu")
    monkeypatch.setattr(memory, "device_memory", lambda d: gpu)
    monkeypatch.setattr(memory, "host_memory", lambda: Memory(24 * GIB, 20 * GIB, "host"))
    bpt, batch_kv = 23_040, 16 * 8192 * 23_040
    mlx = plan(backend="mlx", device="gpu-cuda", bytes_per_token=bpt, weights_bytes=GIB,
               batch_kv_bytes=batch_kv)  # fmt: skip
    free = int(132.5 * GIB) - GIB - batch_kv
    assert mlx.device_tokens == min(int(0.8 * free), free - int(14.1 * GIB)) // bpt
    assert "headroom 14.1 GiB" in mlx.device_source
    tight = Memory(141 * GIB, 40 * GIB, "gpu")  # another process holds most of it
    monkeypatch.setattr(memory, "device_memory", lambda d: tight)
    got = plan(backend="mlx", device="gpu-cuda", bytes_per_token=bpt, batch_kv_bytes=batch_kv)
    assert got.device_tokens == (40 * GIB - batch_kv - int(14.1 * GIB)) // bpt  # headroom binds
    llama = plan(backend="llama.cpp", device="gpu-cuda", bytes_per_token=bpt)
    assert llama.device_tokens == memory.LLAMA_GPU_DEVICE_TOKENS
    asked = plan(backend="llama.cpp", device="gpu-cuda", bytes_per_token=bpt, cache_mem_frac=0.5)
    assert asked.device_tokens > memory.LLAMA_GPU_DEVICE_TOKENS  # a fraction asked is taken
