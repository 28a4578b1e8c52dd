"""A CPU worker's threads: 1 against 2 on this machine, for `tandem serve`'s default.

``tandem serve`` gives a CPU worker the cores the router, the gateway and any GPU
worker's host thread leave it (cores - 2 - GPUs, at least 1). On a 2-core machine
that is 1, while the router and the worker share the cores anyway: is the second
thread worth more to the worker than it costs the router? Measured, not argued:

each round starts a router and one worker (the embedded model, max active 4, no
start-up measurement) per thread count, in alternating order (1, 2 then 2, 1: a
machine whose load drifts favours neither), and times

- TTFT: ``--ttft-requests`` requests one after another, each a fresh random
  ``--ttft-prompt``-token prompt and one output token, from send to first token;
- a burst: ``--burst`` requests at once, ``--burst-prompt`` tokens each decoding
  ``--burst-tokens`` (ignore_eos): output tokens over the wall time of the burst.

    python studies/threads.py --rounds 3 --out threads.json
"""

from __future__ import annotations

import json
import os
import random
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import click

from tandem.launcher.cluster import Cluster, WorkerSpec

VOCAB_LO, VOCAB_HI = 256, 49152  # random prompt ids avoid control tokens


def prompt(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(VOCAB_LO, VOCAB_HI) for _ in range(n)]


def ttft(cl: Cluster, rng: random.Random, requests: int, tokens: int) -> list[float]:
    """Seconds from sending to the first token, one request at a time."""
    out = []
    with cl.client(timeout_s=300.0) as c:
        for _ in range(requests):
            t0 = time.monotonic()
            for _delta in c.stream(tokens=prompt(rng, tokens), max_tokens=1):
                out.append(time.monotonic() - t0)
                break
    return out


def burst(cl: Cluster, seed: int, n: int, prompt_tokens: int, max_tokens: int) -> float:
    """Output tok/s of ``n`` requests sent at once, over the burst's wall time."""
    got = [0] * n
    start = threading.Barrier(n + 1)

    def one(i: int) -> None:
        ids = prompt(random.Random(seed * 1000 + i), prompt_tokens)
        with cl.client(timeout_s=300.0) as c:
            c.ping()  # connected before the clock starts
            start.wait()
            got[i] = len(c.generate(tokens=ids, max_tokens=max_tokens, ignore_eos=True).token_ids)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.monotonic()
    for t in threads:
        t.join()
    return sum(got) / (time.monotonic() - t0)


def one_config(threads: int, seed: int, args: dict[str, Any], cache: Path) -> dict[str, Any]:
    os.environ["TANDEM_CACHE_DIR"] = str(cache)  # no stored profile: nothing from earlier runs
    worker = WorkerSpec("cpu0", ["--threads", str(threads), "--warmup", "off", "--max-active", "4"])
    with Cluster(workers=[worker], start_timeout_s=180.0) as cl:
        rng = random.Random(seed)
        ttft(cl, rng, 1, 16)  # the first request pays one-off costs
        first = ttft(cl, rng, args["ttft_requests"], args["ttft_prompt"])
        rate = burst(cl, seed, args["burst"], args["burst_prompt"], args["burst_tokens"])
    return {"threads": threads, "ttft_s": [round(x, 3) for x in first],
            "ttft_median_s": round(statistics.median(first), 3), "burst_tok_s": round(rate, 1),
            "load_avg_1m": round(os.getloadavg()[0], 2)}  # fmt: skip


@click.command()
@click.option("--rounds", default=3, show_default=True)
@click.option("--ttft-requests", default=5, show_default=True)
@click.option("--ttft-prompt", default=256, show_default=True)
@click.option("--burst", "burst_n", default=8, show_default=True)
@click.option("--burst-prompt", default=64, show_default=True)
@click.option("--burst-tokens", default=64, show_default=True)
@click.option("--out", type=click.Path(dir_okay=False), default=None)
def main(rounds: int, ttft_requests: int, ttft_prompt: int, burst_n: int, burst_prompt: int,
         burst_tokens: int, out: str | None) -> None:  # fmt: skip
    args = {"ttft_requests": ttft_requests, "ttft_prompt": ttft_prompt, "burst": burst_n,
            "burst_prompt": burst_prompt, "burst_tokens": burst_tokens}  # fmt: skip
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="tandem-threads-") as tmp:
        for r in range(rounds):
            order = (1, 2) if r % 2 == 0 else (2, 1)
            for t in order:
                run = {"round": r, **one_config(t, r, args, Path(tmp))}
                click.echo(json.dumps(run))
                runs.append(run)
    summary = {}
    for t in (1, 2):
        mine = [x for x in runs if x["threads"] == t]
        summary[t] = {
            "ttft_median_s": statistics.median(x["ttft_median_s"] for x in mine),
            "burst_tok_s_median": statistics.median(x["burst_tok_s"] for x in mine),
        }
    per_round = [
        {
            "round": r,
            "burst_2_over_1": round(pair[2]["burst_tok_s"] / pair[1]["burst_tok_s"], 2),
            "ttft_2_over_1": round(pair[2]["ttft_median_s"] / pair[1]["ttft_median_s"], 2),
        }
        for r in range(rounds)
        for pair in [{x["threads"]: x for x in runs if x["round"] == r}]
    ]
    result = {"args": args, "runs": runs, "summary": summary, "per_round": per_round}
    click.echo(json.dumps({"summary": summary, "per_round": per_round}, indent=1))
    if out:
        Path(out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
