"""Start-up: how long a worker takes to register, and how well its start-up prices
match what it then serves.

Each run, on a fresh cache folder (no stored profile, so the worker measures itself
quickly, workers/startup.py) or with ``--profiled`` (a ``tandem profile`` stored
first, so it registers at once):

1. a router, then ``tandem worker --progress-json`` (defaults: the embedded model,
   2 threads, max active 4); the clock starts just before the worker process does,
   and its progress lines are timestamped as they arrive: start to ``registered``
   is the number the goal (<= 10 s) is about;
2. the Ready's decode rates by batch size (the start-up prices) from ``tandem
   status``;
3. a minute of closed-loop load: 1, 2, 3 and then 4 concurrent clients for
   ``--phase-s`` each, every request a fresh random prompt of ``--prompt-tokens``
   ids (no prefix cache hit) decoding ``--max-tokens`` (ignore_eos);
4. the rates served then: the worker's live step model (served steps only: a quick
   measurement's steps are not handed to it), aggregate decode tok/s by batch size
   at the context it quotes, as ``tandem status`` shows it, and the median of the
   served decode-only steps by batch size (``TANDEM_STEP_TRACE_DIR``);
5. the control: the same quick measurement again, in this process, right after
   the minute: how much the machine itself changed meanwhile (it is shared).

The ratio start-up price / served rate per batch size is the accuracy (goal within
+/-25 %). The machine is whatever it is: nothing else is stopped for the run.

    python studies/startup.py --runs 3 --out startup.json
"""

from __future__ import annotations

import csv
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import click

from tandem.launcher.cluster import Cluster

VOCAB_LO, VOCAB_HI = 256, 49152  # random prompt ids avoid control tokens


def start_worker(
    cl: Cluster, log: Path, env: dict[str, str], extra: list[str]
) -> tuple[subprocess.Popen, float]:
    cmd = [sys.executable, "-m", "tandem", "worker", "--router", cl.worker_addr,
           "--worker-id", "cpu0", "--progress-json", *extra]  # fmt: skip
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log.open("w"), text=True, env=env)
    return proc, t0


def progress_times(proc: subprocess.Popen, t0: float) -> dict[str, float]:
    """Seconds from start to each progress line kind (measuring: its first and last
    line), until registered (or an error)."""
    assert proc.stdout is not None
    seen: dict[str, float] = {}
    for line in proc.stdout:
        ev, now = json.loads(line), round(time.monotonic() - t0, 3)
        if ev["event"] == "measuring":
            seen.setdefault("measuring_first", now)
            seen["measuring_last"] = now
        else:
            seen.setdefault(ev["event"], now)
        if ev["event"] in ("registered", "error"):
            break
    return seen


def load(cl: Cluster, phase_s: float, prompt_tokens: int, max_tokens: int) -> list[dict]:
    """Closed-loop clients, 1 then 2, 3, 4 at once, ``phase_s`` each: per phase, the
    output tokens the clients received per second."""
    phases = []
    for clients in (1, 2, 3, 4):
        stop_at = time.monotonic() + phase_s
        tokens = [0] * clients

        def client(i: int, stop_at: float = stop_at, tokens: list[int] = tokens) -> None:
            rng = random.Random(i * 7919 + int(stop_at))
            with cl.client(timeout_s=300.0) as c:
                while time.monotonic() < stop_at:
                    ids = [rng.randrange(VOCAB_LO, VOCAB_HI) for _ in range(prompt_tokens)]
                    r = c.generate(tokens=ids, max_tokens=max_tokens, ignore_eos=True)
                    tokens[i] += len(r.token_ids)

        t0 = time.monotonic()
        threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        took = time.monotonic() - t0
        phases.append({"clients": clients, "seconds": round(took, 2),
                       "client_tok_s": round(sum(tokens) / took, 1)})  # fmt: skip
    return phases


def status_row(cl: Cluster) -> dict[str, Any]:
    with cl.client(timeout_s=10.0) as c:
        return next(w for w in c.status().workers if w["id"] == "cpu0")


def one_run(args: dict[str, Any], cache: Path) -> dict[str, Any]:
    trace = cache / "steps"  # every served step (workers/steptimer.py)
    env = {**os.environ, "TANDEM_CACHE_DIR": str(cache), "PYTHONUNBUFFERED": "1",
           "TANDEM_STEP_TRACE_DIR": str(trace)}  # fmt: skip
    load_start = os.getloadavg()[0]
    with Cluster(router_args=["--no-worker-wait-s", "120"]) as cl:
        assert cl.log_dir is not None
        proc, t0 = start_worker(cl, cl.log_dir / "cpu0.log", env, args["worker_args"])
        try:
            times = progress_times(proc, t0)
            first = status_row(cl)
            phases = load(cl, args["phase_s"], args["prompt_tokens"], args["max_tokens"])
            time.sleep(2.0)  # the last steps ride a heartbeat (steps_every_s: 1 s)
            last = status_row(cl)
            load_end = os.getloadavg()[0]
            again = measure_again(_threads(args["worker_args"]))
            log = (cl.log_dir / "cpu0.log").read_text()
        finally:
            proc.kill()
            proc.wait(timeout=30)
    served = last["live_decode_tok_s"]
    start = first["decode_tok_s"]
    return {
        "load_avg_1m": [round(load_start, 2), round(load_end, 2)],
        "times_s": times,
        "again_decode_tok_s": again,
        "again_over_start": ratios(again, start),
        "provisional_at_start": first["provisional"],
        "provisional_after": last["provisional"],
        "start_prefill_tok_s": first["prefill_tok_s"],
        "start_decode_tok_s": start,
        "served_decode_tok_s": served,
        "served_decode_steps": last["live_decode_samples"],
        "served_context_tokens": last["live_context_tokens"],
        "served_prefill_tok_s": last["live_prefill_tok_s"],
        "start_over_served": ratios(start, served),
        "served_median_tok_s": (medians := step_medians(trace))[0],
        "served_decode_steps_by_batch": medians[1],
        "start_over_served_median": (close := ratios(start, medians[0])),
        "served_steps_within_25pct": within(close, medians[1]),
        "phases": phases,
        "notes": [x.split(": ", 1)[-1] for x in log.splitlines() if "start-up measurement" in x],
    }


def _threads(worker_args: list[str]) -> int:
    """The worker's --threads among its arguments (the control measures alike); 0, the
    worker's own default (workers/config.py default_threads), when none is given."""
    flags = [a for arg in worker_args for a in arg.split("=", 1)]
    return int(flags[flags.index("--threads") + 1]) if "--threads" in flags else 0


def measure_again(threads: int) -> list[float]:
    """The control: the worker's quick measurement again, here, right after the minute
    (the worker still holds its model, idle), on as many threads: what the machine
    measures now."""
    from tandem.workers.backends import build_backend
    from tandem.workers.config import WorkerConfig
    from tandem.workers.profiler import warm_up
    from tandem.workers.rates import measured_rates
    from tandem.workers.startup import QUICK_CONTEXT, QUICK_STEPS

    cfg = WorkerConfig(router="tcp://127.0.0.1:1", threads=threads)
    backend = build_backend(cfg)
    warm = warm_up(backend, cfg.engine.max_active, cfg.engine.step_tokens,
                   context=QUICK_CONTEXT, measure_steps=QUICK_STEPS, compile_pass=False,
                   prefill_probe=False)  # fmt: skip
    _, decode = measured_rates(200.0, [50.0], warm, None, cfg.engine.max_active)
    return [round(x, 2) for x in decode]


def ratios(start: list[float], served: list[float | None]) -> list[float | None]:
    """start[i] / served[i], None where nothing was served."""
    return [None if s is None else round(a / s, 3) for a, s in zip(start, served, strict=False)]


def step_medians(trace: Path) -> tuple[list[float | None], list[int]]:
    """Aggregate decode tok/s at batch 1..4 from the median of the served decode-only
    steps (the live model's clipped mean counts a stall as up to 4 median steps), and
    how many such steps each batch size served."""
    rows = [r for f in trace.glob("*.csv") for r in csv.DictReader(f.open())]
    out: list[float | None] = []
    counts: list[int] = []
    for b in range(1, 5):
        steps = [float(r["seconds"]) for r in rows
                 if int(r["batch"]) == b and int(r["prefill_tokens"]) == 0]  # fmt: skip
        out.append(round(b / statistics.median(steps), 2) if steps else None)
        counts.append(len(steps))
    return out, counts


def within(close: list[float | None], steps: list[int], tolerance: float = 0.25) -> float:
    """The share of served decode steps whose batch size was priced at start within
    ``tolerance`` of its served median: the batch sizes weighted as served."""
    hit = sum(n for r, n in zip(close, steps, strict=False) if r and abs(r - 1) <= tolerance)
    return round(hit / max(1, sum(steps)), 3)


def profile_into(cache: Path) -> None:
    """A stored profile in ``cache`` (``tandem profile``, its defaults)."""
    env = {**os.environ, "TANDEM_CACHE_DIR": str(cache)}
    subprocess.run([sys.executable, "-m", "tandem", "profile"], env=env, check=True,
                   capture_output=True, timeout=900)  # fmt: skip


@click.command()
@click.option("--runs", type=int, default=3, show_default=True)
@click.option("--profiled", is_flag=True, help="Store a tandem profile first (one per run).")
@click.option("--phase-s", type=float, default=15.0, show_default=True)
@click.option("--prompt-tokens", type=int, default=200, show_default=True)
@click.option("--max-tokens", type=int, default=64, show_default=True)
@click.option("--worker-arg", "worker_args", multiple=True, help="Passed to tandem worker.")
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="JSON results here.")
def main(runs: int, profiled: bool, phase_s: float, prompt_tokens: int, max_tokens: int,
         worker_args: tuple[str, ...], out: str | None) -> None:  # fmt: skip
    """Worker start to registered, and start-up prices vs served rates, ``runs`` times."""
    args = {"phase_s": phase_s, "prompt_tokens": prompt_tokens, "max_tokens": max_tokens,
            "worker_args": list(worker_args)}  # fmt: skip
    results = []
    for i in range(runs):
        with tempfile.TemporaryDirectory(prefix="tandem-startup-") as tmp:
            if profiled:
                profile_into(Path(tmp))
            result = one_run(args, Path(tmp))
        results.append(result)
        click.echo(f"run {i + 1}: registered after {result['times_s'].get('registered')} s; "
                   f"start / served {result['start_over_served']}, / served median "
                   f"{result['start_over_served_median']}; again / start "
                   f"{result['again_over_start']}; steps priced within 25 %: "
                   f"{result['served_steps_within_25pct']}; "
                   f"load {result['load_avg_1m']}")  # fmt: skip
    doc = {"args": {**args, "runs": runs, "profiled": profiled}, "cpus": os.cpu_count(),
           "load_avg_1m_at_end": os.getloadavg()[0], "runs": results}  # fmt: skip
    if out:
        Path(out).write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
