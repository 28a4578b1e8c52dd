"""studies/router_overhead.py end to end at a tiny size: every path it measures answers.

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
from studies.router_overhead import OverheadConfig, run_all
cfg = OverheadConfig(requests=120, window=16, streams=4, stream_tokens=40,
                     latency_requests=10, decision_workers=(1, 8), swarm=4, swarm_window_s=1.0)
print(json.dumps(run_all(cfg, runs=1, progress=lambda line: None)))
"""


DEAD_ROUTER = """
import operator, time
from studies import router_overhead as ro
ro._run_router = operator.truediv  # importable, and fails on (client, worker, stop) at once
t0 = time.monotonic()
try:
    ro.measure_path("router", ro.OverheadConfig(requests=10, stream_tokens=4, latency_requests=10))
except RuntimeError as exc:
    print(round(time.monotonic() - t0, 1), exc)
"""


def test_a_path_whose_process_dies_fails_at_once_and_says_which():
    """A router that dies at start (once: a broken build) made the bench wait out its
    warm-up, and say only that the path never answered."""
    out = subprocess.run(
        [sys.executable, "-c", DEAD_ROUTER], capture_output=True, text=True, timeout=60, check=True
    )
    took, message = out.stdout.strip().splitlines()[-1].split(" ", 1)
    assert "truediv exited with code 1" in message
    assert float(took) < 20  # the warm-up's own limit is 30 s


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
