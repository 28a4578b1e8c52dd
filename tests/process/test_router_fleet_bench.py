"""studies/router_fleet.py (``-m studies.router_overhead --workers N``) end to end at a
tiny size: a router in front of a few live null workers routes, answers ``status`` and
is measured.

Only that the bench still drives today's router; its numbers are
docs/results/router-fleet.md's business. In a process of its own, as
test_router_bench.py says why.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(180)

TINY = """
import json
from studies.router_fleet import measure_fleet
print(json.dumps(measure_fleet(3, requests=150, window=8, idle_s=0.5, decisions=20)))
"""


def test_a_tiny_fleet_is_routed_and_measured() -> None:
    out = subprocess.run([sys.executable, "-c", TINY], capture_output=True, text=True, timeout=170)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["workers"] == 3
    assert got["req_s"] > 0 and got["req_per_cpu_s"] > 0
    assert got["rss_mb"] > 10 and got["status_ms"] > 0
    assert 0 < got["decision_p50_ms"] <= got["decision_p99_ms"]
