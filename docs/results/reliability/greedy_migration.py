"""How often a migrated greedy stream differs from an undisturbed one, with llama.cpp.

Each prompt is streamed greedily on llama.cpp worker "a" while worker "b" starts;
once the client has seen at least ``CUT`` tokens and "b" is up, "a" is killed
(kill -9) and the stream continues on "b". The reference is the same request
run undisturbed on "b" afterwards.

    python docs/results/reliability/greedy_migration.py
"""

from __future__ import annotations

import json
import threading
import time

from tandem.client import Client
from tandem.launcher.cluster import Cluster, WorkerSpec

# No prefix cache: every run is cold, so the paths differ only by the move itself.
ARGS = ["--threads", "1", "--n-ctx", "2048", "--max-active", "2", "--heartbeat-s", "0.2",
        "--cache-tokens", "0"]  # fmt: skip
PROMPTS = [
    "Write a short story about a lighthouse keeper.",
    "Explain how a bicycle gear works.",
    "List five uses of copper and explain each.",
    "Describe the water cycle to a child.",
]
N, CUT = 160, 48


def one(prompt: str) -> dict:
    with Cluster(workers=[WorkerSpec("a", ARGS)]) as cl:
        msgs = [{"role": "user", "content": prompt}]
        got: list[int] = []
        b_up = threading.Thread(target=cl.start_worker, args=(WorkerSpec("b", ARGS),))
        with Client(cl.client_addr, timeout_s=120) as c:
            s = c.stream(messages=msgs, max_tokens=N, ignore_eos=True)  # on "a": alone
            for d in s:
                got += d.token_ids
                if not b_up.is_alive() and b_up.ident is None:
                    b_up.start()  # "b" loads while "a" streams
                if len(got) >= CUT and "a" in cl.procs and not b_up.is_alive():
                    cl.kill("a")
            result = s.result
            ref = c.generate(messages=msgs, max_tokens=N, ignore_eos=True, worker="b").token_ids
        pairs = enumerate(zip(got, ref, strict=False))
        first_diff = next((i for i, (x, y) in pairs if x != y), None)
        return dict(prompt=prompt[:30], migrated_at=result.stats.get("migrated_tokens"),
                    worker=result.worker, identical=got == ref, first_diff=first_diff)  # fmt: skip


if __name__ == "__main__":
    for p in PROMPTS:
        t = time.monotonic()
        print(json.dumps({**one(p), "took_s": round(time.monotonic() - t, 1)}), flush=True)
