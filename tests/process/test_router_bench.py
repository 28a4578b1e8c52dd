"""``tandem bench router`` end to end at a tiny size: every path it measures answers.

The numbers themselves are the benchmark's business (docs/results/router-overhead.md);
this only guards that the bench still drives today's router (it reaches into the
router's assignment code to preload workers, so a changed signature breaks it). It
runs in a process of its own: the bench spawns processes, opens hundreds of sockets
and freezes the collector, none of which the test process should inherit.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(180)

TINY = """
import json
from tandem.bench.router_overhead import OverheadConfig, run_all
cfg = OverheadConfig(requests=120, window=16, streams=4, stream_tokens=40,
                     latency_requests=10, decision_workers=(1, 8), swarm=4, swarm_window_s=1.0)
print(json.dumps(run_all(cfg, runs=1, progress=lambda line: None)))
"""


def test_the_router_bench_measures_every_path_at_a_tiny_size():
    out = subprocess.run(
        [sys.executable, "-c", TINY], capture_output=True, text=True, timeout=150, check=True
    )
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    run = doc["runs"][0]
    for path in ("direct", "relay", "router"):
        assert run["paths"][path]["req_s"] > 0, path
        assert run["paths"][path]["tok_s"] > 0, path
    assert set(run["decision_ms"]) == {"1", "8"}
    assert all(ms > 0 for ms in run["decision_ms"].values())
    assert run["swarm"]["rss_mb"] > 0 and run["swarm"]["registered"] == 4
    assert doc["summary"]
