"""Where serving's decode steps lose time against the warm-up's: one factor at a time.

On the H200 the router priced the GPU worker, at the end of serving runs, 1.1-2.3x
slower per decode step than the same worker's warm-up had measured
(docs/results/h200/matrix-warm/, matrix-warm2/). A serving worker differs from its
warm-up in three ways at once: its batch is ragged and churns (rows of different
lengths, one finishing and another admitted with its cached prefix every few
steps), it serves (an I/O thread sending every step's tokens, heartbeats), and
other workers run beside it. This tool times decode steps in-process with the
engine's own step timer (the numbers the router prices with), one factor at a
time, modes alternated per round:

- ``aligned``: the old warm-up's pattern — ``b`` requests after one shared cached
  prefix, started together, decoding side by side to the end;
- ``churn``: ``b`` slots kept full for ``steps`` steps by requests of staggered
  lengths after the same cached prefix, so every few steps one finishes (its KV
  stored in the prefix cache) and the next is admitted (its prefix restored);
- ``serve``: ``churn`` inside a serving process: the engine's tokens and
  heartbeats go out through the worker's real I/O thread (workers/io.py) to a
  stand-in router in another process (on other cores) that welcomes the worker and
  drops what it sends, and the engine loop drains its inbox and heartbeats as
  ``Engine.run`` does;
- ``serve-switch``: ``serve`` with the interpreter's thread switch interval at
  0.5 ms (default 5): whether the I/O thread and the compute thread wait on each
  other for the GIL;
- ``aligned-mask`` / ``aligned-addmask`` (MLX only): ``aligned`` with an attention
  mask although no row is padded, boolean / additive (0 or -inf) — what a ragged
  batch's mask alone costs; ``churn-addmask``: ``churn`` with the additive mask;
- ``--neighbour-cpus``: every mode also beside a llama.cpp engine decoding 4
  requests nonstop on those cores in another process (as the CPU worker does when
  a router splits a burst), idle / busy alternated.

On the box (matrix-warm2/README.md): churn cost 1.2-1.6x over aligned in one call
and did not repeat in the next; serving through the I/O thread cost nothing beyond
churn; a forced mask +24-26 % in two rounds of three. The neighbour is untested
there.

    python -m studies.step_gap --backend mlx --device gpu --batch 4,8 --out gap.json
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import random
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import click

from tandem.cli.options import out_file_option
from tandem.common import protocol as p
from tandem.common.affinity import parse_cpus
from tandem.common.protocol import SamplingParams
from tandem.common.steptime import center
from tandem.workers.engine import Engine
from tandem.workers.io import WorkerLink, start_link
from tandem.workers.profiler import _engine, _prompt
from tandem.workers.request import Request

CONTEXT = 512  # prompt tokens shared by every request (the seed preset's prefix)
MODES = ("aligned", "churn", "serve", "serve-switch")
MASK_MODES = ("aligned-mask", "aligned-addmask", "churn-addmask")
FAST_SWITCH_S = 0.0005


def stand_in_router(address: str, stop: Any) -> None:
    """Welcome every worker that registers at ``address``; drop whatever else it sends.
    Runs in its own process, moved off the cores the measuring process is pinned to."""
    import zmq

    elsewhere = set(range(os.cpu_count() or 1)) - os.sched_getaffinity(0)
    if elsewhere:
        os.sched_setaffinity(0, elsewhere)
    sock: zmq.Socket = zmq.Context.instance().socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(address)
    while not stop.is_set():
        if not sock.poll(100):
            continue
        identity, frame = sock.recv_multipart()
        try:
            msg = p.decode(frame)
        except p.ProtocolError:
            continue
        if isinstance(msg, p.Ready):
            sock.send_multipart([identity, p.encode(p.Welcome(epoch="step-gap"))])


def busy_neighbour(cpus: tuple[int, ...], threads: int, loaded: Any, go: Any, stop: Any) -> None:
    """Keep a llama.cpp engine decoding 4 requests on ``cpus`` while ``go`` is set;
    ``loaded`` is set once its model is."""
    from tandem.common.affinity import pin
    from tandem.workers.backends import build_backend
    from tandem.workers.config import EngineConfig, WorkerConfig

    pin(cpus)
    cfg = WorkerConfig(
        router="inproc://unused", backend="llama.cpp", threads=threads, n_ctx=8192,
        engine=EngineConfig(max_active=4),
    )  # fmt: skip
    backend = build_backend(cfg)
    engine, _ = _engine(backend, 4, 256)
    loaded.set()
    rng, n = random.Random(1), 0
    while not stop.is_set():
        if not go.is_set():
            time.sleep(0.02)
            continue
        while len(engine.queue) + len(engine.active) < 4:
            prompt = _prompt(rng, 256, backend.vocab_size)
            engine.submit(Request(f"n{n}", prompt, SamplingParams(max_tokens=64, ignore_eos=True)))
            n += 1
        engine.step()


class Serving:
    """The serving process's side of a run: an I/O thread linked to the stand-in."""

    def __init__(self, engine: Engine, address: str, ready: p.Ready) -> None:
        self.stop = threading.Event()
        self.link = WorkerLink(address, ready, engine.inbox)
        self.thread = start_link(self.link, self.stop)
        if not self.link.registered.wait(30):
            raise RuntimeError(f"the stand-in router at {address} never welcomed us")
        engine.emit = self.link.emit

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)


def record_decode_steps(engine: Engine, batch: int) -> list[float]:
    """Every decode step the engine's timer records at exactly ``batch`` rows, from now
    on (its own windows keep only the last 64)."""
    seen: list[float] = []
    rows, record = batch, engine.timer.stats.record

    def tee(batch: int, context_tokens: int, prefill_tokens: int, seconds: float) -> None:
        if batch == rows and prefill_tokens == 0:
            seen.append(seconds)
        record(batch, context_tokens, prefill_tokens, seconds)

    engine.timer.stats.record = tee  # type: ignore[method-assign]  # a hook on this one timer
    return seen


def run_mode(
    backend: Any, mode: str, batch: int, steps: int, seed: int = 0,
    serve: tuple[str, p.Ready] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """One pattern on a fresh engine; decode step medians at ``batch`` rows (ms).
    The ``serve`` modes need ``serve``: the stand-in router's address and a Ready."""
    rng = random.Random(seed)
    cache = (CONTEXT + steps + 8) * (batch + 2) + 512
    engine, _ = _engine(backend, batch, max(256, batch), cache_tokens=cache)
    prefix = _prompt(rng, CONTEXT - 1, backend.vocab_size)

    def request(i: int, n_out: int) -> Request:
        prompt = [*prefix, *_prompt(rng, 1, backend.vocab_size)]
        return Request(f"{mode}-{i}", prompt, SamplingParams(max_tokens=n_out, ignore_eos=True))

    seed_req = Request("seed", [*prefix, 1], SamplingParams(max_tokens=1, prefill_only=True))
    engine.submit(seed_req)
    while engine.queue or engine.active:
        engine.step()
    samples = record_decode_steps(engine, batch)
    batch_class = _mask_modes(backend, mode)
    serving = Serving(engine, *serve) if mode.startswith("serve") and serve else None
    switch = sys.getswitchinterval()
    if mode == "serve-switch":
        sys.setswitchinterval(FAST_SWITCH_S)
    if mode.startswith("aligned"):
        for i in range(batch):
            engine.submit(request(i, steps))
    else:  # staggered lengths: a departure and an admission every ~steps/(4 batch) steps
        period = max(8, steps // 4)
        for i in range(4 * batch):
            engine.submit(request(i, period + (i * period) // batch))
    stepped = 0
    try:
        while (engine.queue or engine.active) and stepped < 8 * steps:
            if serving:  # as Engine.run: the inbox, the step, the heartbeat
                engine.drain_inbox(block=False)
            engine.step()
            if serving:
                engine.maybe_heartbeat()
            stepped += 1
    finally:
        sys.setswitchinterval(switch)
        if batch_class is not None:
            batch_class.always_mask = batch_class.additive_mask = False
        if serving:
            serving.close()
    engine.timer.stop()
    for handle in engine.cache.clear():
        backend.free(handle)
    return {
        "mode": mode,
        "batch": batch,
        "steps_at_batch": len(samples),
        "median_ms": 1e3 * statistics.median(samples) if samples else None,
        "p90_ms": 1e3 * sorted(samples)[int(0.9 * (len(samples) - 1))] if samples else None,
        # What a run of steps takes per step, and what the router prices a step at
        # (common.steptime.center; a tenth-trimmed mean until the clipped mean).
        "mean_ms": 1e3 * statistics.fmean(samples) if samples else None,
        "priced_ms": 1e3 * center(samples) if samples else None,
        "request_host_s": engine.timer.request_s,
    }


def _mask_modes(backend: Any, mode: str) -> Any:
    """Set up a mask mode on the MLX backend's decode batch; its class, or None."""
    if mode not in MASK_MODES:
        return None
    from tandem.workers.backends.mlx.batch import DecodeBatch

    if not isinstance(getattr(backend, "_batch", None), DecodeBatch):
        raise click.UsageError(f"mode {mode} needs the mlx backend")
    DecodeBatch.always_mask = mode.startswith("aligned")
    DecodeBatch.additive_mask = "addmask" in mode
    return DecodeBatch


@click.command()
@click.option("--backend", "backend_name", default="mlx", show_default=True)
@click.option("--device", default="gpu", show_default=True)
@click.option("--model", default=None, help="GGUF (default: the embedded model).")
@click.option("--threads", type=int, default=4, show_default=True, help="llama.cpp threads.")
@click.option("--batch", "batches", default="4,8", show_default=True)
@click.option("--steps", type=int, default=256, show_default=True)
@click.option("--rounds", type=int, default=3, show_default=True, help="Alternations.")
@click.option(
    "--modes",
    default=",".join(MODES),
    show_default=True,
    help=f"Patterns to alternate; also {', '.join(MASK_MODES)} (mlx).",
)
@click.option(
    "--neighbour-cpus",
    default=None,
    help="Also run each mode beside a busy llama.cpp engine on these cores.",
)
@click.option("--neighbour-threads", type=int, default=10, show_default=True)
@out_file_option()
def main(
    backend_name: str, device: str, model: str | None, threads: int, batches: str,
    steps: int, rounds: int, modes: str, neighbour_cpus: str | None,
    neighbour_threads: int, out: str | None,
) -> None:  # fmt: skip
    """Decode step medians, aligned vs churning batches, alternated ``rounds`` times."""
    from tandem.workers.backends import build_backend
    from tandem.workers.config import EngineConfig, WorkerConfig
    from tandem.workers.main import ready_message
    from tandem.workers.rates import rates

    sizes = [int(b) for b in batches.split(",")]
    names = [m for m in modes.split(",") if m]
    unknown = set(names) - {*MODES, *MASK_MODES}
    if unknown:
        raise click.UsageError(f"unknown modes: {', '.join(sorted(unknown))}")
    n_ctx = (CONTEXT + steps + 8) * (max(sizes) + 2) + 4096
    cfg = WorkerConfig(
        router="inproc://unused", backend=backend_name, model=model, device=device,
        threads=threads, n_ctx=n_ctx, engine=EngineConfig(max_active=max(sizes)),
    )  # fmt: skip
    backend = build_backend(cfg)
    run_mode(backend, "aligned", sizes[0], 16)  # compile / warm what the first shapes need
    address = f"ipc:///tmp/tandem-step-gap-{uuid.uuid4().hex[:8]}"
    ready = ready_message(cfg, backend, "step-gap", *rates(cfg, backend))
    spawn = mp.get_context("spawn")
    stop = spawn.Event()
    router = spawn.Process(target=stand_in_router, args=(address, stop), daemon=True)
    router.start()
    go, loaded = spawn.Event(), spawn.Event()
    neighbours = ["idle"]
    if neighbour_cpus:
        neighbours = ["idle", "busy"]
        args = (parse_cpus(neighbour_cpus), neighbour_threads, loaded, go, stop)
        spawn.Process(target=busy_neighbour, args=args, daemon=True).start()
    rows = []
    try:
        for r in range(rounds):
            for b in sizes:
                for mode in names:
                    for nb in neighbours if r % 2 == 0 else neighbours[::-1]:
                        if nb == "busy":
                            if not loaded.wait(300):
                                raise RuntimeError("the busy neighbour never loaded its model")
                            go.set()
                            time.sleep(0.5)  # decoding before the first timed step
                        try:
                            row = run_mode(backend, mode, b, steps, r, (address, ready))
                        finally:
                            go.clear()
                        row |= {"round": r, "neighbour": nb}
                        rows.append(row)
                        click.echo(json.dumps(row), err=True)
    finally:
        stop.set()
        router.join(timeout=5)
    summary = {
        f"{mode}{'' if nb == 'idle' else '+busy'}@{b}": statistics.median(
            x["median_ms"]
            for x in rows
            if (x["mode"], x["batch"], x["neighbour"]) == (mode, b, nb) and x["median_ms"]
        )
        for b in sizes
        for mode in names
        for nb in neighbours
    }
    click.echo(json.dumps(summary))
    if out:
        doc = {"backend": backend.name, "device": backend.device, "rows": rows}
        Path(out).write_text(json.dumps(doc | {"median_ms": summary}, indent=1))


if __name__ == "__main__":
    main()
