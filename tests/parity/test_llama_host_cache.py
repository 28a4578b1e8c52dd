"""The host-RAM tier on a real llama.cpp worker: a prefix saved to host RAM, restored, and
the same greedy tokens as a fresh prefill (the embedded SmolLM2-135M, 1 thread)."""

from __future__ import annotations

import ctypes

import pytest

from tests.helpers import needs_llama

pytestmark = needs_llama

TEXT = (
    "The history of the city begins with a small fishing village on the river. Over the "
    "centuries it grew into a market town, then a port, and finally the capital of the "
    "region. Its old bridge, built of grey stone, still stands today and"
)


@pytest.fixture(scope="module")
def engines():
    from tandem.common.model_files import default_model_path
    from tandem.workers.backends.llama import LlamaBackend
    from tandem.workers.config import EngineConfig
    from tandem.workers.engine import Engine

    backend = LlamaBackend(default_model_path(), n_ctx=512, threads=1, max_active=1,
                           cache_entries=None, step_tokens=64, cache_tokens=128)  # fmt: skip
    out: list = []
    cfg = EngineConfig(max_active=1, step_tokens=64, block_size=16, cache_tokens=80,
                       host_cache_tokens=4096, max_tokens_limit=64)  # fmt: skip
    yield Engine(backend, cfg, out.append, "w"), backend, out
    backend.close()


def tokenize(backend, text: str) -> list[int]:
    import llama_cpp as L

    buf = (L.llama_token * 512)()
    n = L.llama_tokenize(backend.vocab, text.encode(), len(text.encode()), buf, 512, False, False)
    return list(buf[:n])


def generate(engine, out, rid: str, prompt: list[int], n: int = 8):
    from tandem.common import protocol as p
    from tandem.workers.request import Request

    engine.submit(Request(rid, prompt, p.SamplingParams(max_tokens=n, temperature=0.0)))
    for _ in range(200):
        if not (engine.queue or engine.active):
            break
        engine.step()
    done = next(m for m in out if isinstance(m, p.Done) and m.request_id == rid)
    tokens = [t for m in out if isinstance(m, p.TokenDelta) and m.request_id == rid
              for t in m.token_ids]  # fmt: skip
    return tokens, done.stats


def test_a_prefix_restored_from_host_ram_decodes_as_a_fresh_prefill(engines):
    from tandem.workers.prefix_cache import DEVICE, HOST

    engine, backend, out = engines
    prompt = tokenize(backend, TEXT)
    assert 48 < len(prompt) < 100
    fresh, stats = generate(engine, out, "fresh", prompt)
    assert stats.cached_tokens == 0
    # Another prompt fills the device tier: the first one moves to host RAM.
    generate(engine, out, "other", tokenize(backend, "Once upon a time " * 8))
    tiers = {e.tokens[0]: e.tier for e in engine.cache.entries.values()}
    assert tiers[prompt[0]] == HOST, "the first prompt's KV was saved to host RAM"
    state = next(e.handle for e in engine.cache.entries.values() if e.tier == HOST)
    assert isinstance(state.data, ctypes.Array) and state.nbytes > 20_000 * state.n_tokens
    again, stats = generate(engine, out, "again", prompt)
    assert stats.cached_tokens == (len(prompt) - 1) // 16 * 16, "restored, not prefilled"
    entries = engine.cache.entries.values()
    assert any(e.tier == DEVICE and e.tokens[:8] == prompt[:8] for e in entries)
    assert again == fresh
