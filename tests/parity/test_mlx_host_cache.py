"""MLX's host-RAM tier: an entry evicted from the device is copied to host memory,
restored on a hit, and the request continues exactly as a cold run (tiny model, CPU)."""

from __future__ import annotations

import pytest

mx = pytest.importorskip("mlx.core")

from tandem.workers.prefix_cache import DEVICE, HOST  # noqa: E402
from tests.parity.test_mlx_backend import Harness, greedy, prompts, tiny  # noqa: E402, F401

pytestmark = pytest.mark.mlx


def test_an_entry_restored_from_host_ram_continues_like_a_cold_run(tiny) -> None:  # noqa: F811
    shared, other = prompts()[2], prompts(1)[2]  # 40 tokens each: 32 of them reusable
    tail = [101, 202, 303, 404, 505, 606, 707, 808]
    cold = Harness(tiny).run(greedy("cold", shared + tail, 10))["cold"]
    h = Harness(tiny, cache_tokens=48, host_cache_tokens=1000)
    h.run(greedy("seed", shared, 1))
    h.run(greedy("other", other, 1))  # the device tier holds one entry: seed's moves out
    tiers = {e.tokens[0]: e.tier for e in h.engine.cache.entries.values()}
    assert tiers == {shared[0]: HOST, other[0]: DEVICE}
    state = next(e.handle for e in h.engine.cache.entries.values() if e.tier == HOST)
    assert state.nbytes > 0 and state.n_tokens == len(shared)
    warm = h.run(greedy("warm", shared + tail, 10))["warm"]
    assert h.done("warm").stats.cached_tokens == 32, "restored, not prefilled"
    assert warm == cold
    h.assert_released()
