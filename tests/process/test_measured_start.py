"""A worker asked to measure itself in full (``--warmup on``; a GPU's default)
measures every batch shape before it registers.

Real llama.cpp worker, real router: what the router is told in Ready and what its
live model holds before any request has run both come from the warm-up. (Without
a profile a CPU worker measures quickly instead: tests/process/test_worker_start.py.)
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tandem.launcher.cluster import Cluster, WorkerSpec
from tandem.workers.config import DEFAULT_DECODE_TOK_S, DEFAULT_PREFILL_TOK_S
from tests.helpers import LLAMA_ARGS, needs_llama

pytestmark = [needs_llama, pytest.mark.model]


def test_an_unprofiled_worker_advertises_its_measurement_and_the_router_has_its_steps(
    tmp_path, monkeypatch
) -> None:
    monkeypatch.setenv("TANDEM_CACHE_DIR", str(tmp_path))  # no stored profile anywhere
    args = [a for a in LLAMA_ARGS if a not in ("--warmup", "off")] + ["--warmup", "on"]
    assert "--decode-tok-s" not in args
    with Cluster(workers=[WorkerSpec("cpu0", args)]) as cl:
        status = subprocess.run(
            [sys.executable, "-m", "tandem", "status", "--router", cl.client_addr, "--json"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert status.returncode == 0, status.stderr
        (row,) = json.loads(status.stdout)["workers"]
        log = cl.log("cpu0")
    assert row["decode_tok_s"] != [DEFAULT_DECODE_TOK_S] * 4, "advertised the guess"
    assert row["prefill_tok_s"] != DEFAULT_PREFILL_TOK_S
    assert row["decode_tok_s"] == sorted(row["decode_tok_s"]) and min(row["decode_tok_s"]) > 0
    # No request has run, yet the live model has the warm-up's steps at 1, 2 and 4.
    assert all(row["live_decode_samples"][b - 1] >= 8 for b in (1, 2, 4)), row
    assert row["live_context_tokens"] > 400  # measured after 512-token prompts
    assert "measured at start" in log and "rough default" not in log
