"""Tools of the chaos suite (tests/process/test_chaos.py): streams on threads, the
router's memory and ledgers, references, and the figures docs/results/reliability.md
reports (written as JSON lines to $TANDEM_CHAOS_REPORT when it is set)."""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tandem.client import Client, TandemError
from tandem.common import protocol as p
from tandem.common.transport import DealerSocket

# Sim workers: the engine, queue and sockets are real, the model is played back.
SIM = ["--backend", "sim", "--warmup", "off", "--heartbeat-s", "0.2"]
GPU = [*SIM, "--profile", "gpu-m2"]
CPU = [*SIM, "--profile", "cpu-m2"]
BOUND_S = 30.0  # every wait in the suite ends by this, pass or fail


def prompt(i: int, n: int = 24) -> list[int]:
    return [1000 + (i * 131 + k * 7) % 30000 for k in range(n)]


@dataclass
class Run:
    """One request streamed on its own thread with its own Client."""

    address: str
    kwargs: dict[str, Any]
    keys: str | None = None
    token_ids: list[int] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)
    result: Any = None
    error: TandemError | None = None
    ended_at: float = 0.0

    def start(self) -> Run:
        self.thread = threading.Thread(target=self._go, daemon=True)
        self.thread.start()
        return self

    def _go(self) -> None:
        try:
            with Client(self.address, timeout_s=BOUND_S, keys=self.keys) as c:
                s = c.stream(**self.kwargs)
                for d in s:
                    self.token_ids += d.token_ids
                    self.text.append(d.text)
                    self.arrivals.append(time.monotonic())
                self.result = s.result
        except TandemError as exc:
            self.error = exc
        self.ended_at = time.monotonic()

    def join(self) -> Run:
        self.thread.join(BOUND_S)
        assert not self.thread.is_alive(), f"request {self.kwargs} did not end in {BOUND_S}s"
        return self

    def max_gap_s(self) -> float:
        gaps = [b - a for a, b in zip(self.arrivals, self.arrivals[1:], strict=False)]
        return max(gaps, default=0.0)


def wait_until(check: Any, what: str, timeout_s: float = BOUND_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def references(address: str, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Each prompt's output run alone, undisturbed (sim output is greedy-like)."""
    with Client(address, timeout_s=BOUND_S) as c:
        return [
            c.generate(tokens=t, max_tokens=max_tokens, ignore_eos=True).token_ids for t in prompts
        ]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def assert_ledgers_empty(address: str, keys: str | None = None) -> None:
    """Router and workers hold no request: nothing in flight, pending, active or queued."""
    with Client(address, timeout_s=BOUND_S, keys=keys) as c:

        def empty() -> bool:
            st = c.status()
            busy = any(w["inflight"] or w["active"] or w["queued"] for w in st.workers)
            return not (st.requests_in_flight or st.requests_pending or busy)

        wait_until(empty, "empty ledgers")


def removed_workers(log_text: str) -> int:
    return log_text.count(" removed: ")


def record(scenario: str, **figures: Any) -> None:
    """Append this scenario's figures for docs/results/reliability.md."""
    path = os.environ.get("TANDEM_CHAOS_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"scenario": scenario, **figures}) + "\n")


def collect(sock: DealerSocket, ids: set[str], timeout_s: float = BOUND_S) -> dict[str, list]:
    """Every message for ``ids`` on a raw client socket until each has ended."""
    got: dict[str, list] = {i: [] for i in ids}
    open_ids, deadline = set(ids), time.monotonic() + timeout_s
    while open_ids and time.monotonic() < deadline:
        if not sock.poll(100):
            continue
        msg = sock.recv()
        rid = getattr(msg, "request_id", None)
        assert rid in got, f"a message for a request we never sent: {msg}"
        got[rid].append(msg)
        if isinstance(msg, p.Done | p.Error):
            open_ids.discard(rid)
    assert not open_ids, f"{len(open_ids)} requests never ended"
    return got


def fake_ready(worker_id: str, tokenizer: dict, fast: bool = True, **kw: Any) -> p.Ready:
    rate = 1e6 if fast else 1.0
    fields: dict[str, Any] = dict(
        worker_id=worker_id, backend="sim", device="fake", model="SmolLM2-135M-Instruct.Q4_1.gguf",
        max_active=4, n_ctx=8192, block_size=16, prefill_tok_s=rate, decode_tok_s=[rate] * 4,
        heartbeat_s=0.2, tokenizer=tokenizer,
    )  # fmt: skip
    fields.update(kw)
    fields["decode_tok_s"] = [rate] * fields["max_active"]
    return p.Ready(**fields)
