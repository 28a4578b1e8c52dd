"""What a worker does before it registers: price itself within seconds, and say so.

A worker used to measure every batch shape at a 512-token context before it
registered: ~10 s on an idle 2-core machine, 120 s on a busy one, with nothing
shown, and a busy machine's numbers were nonsense anyway. Now it registers with
the prices it has, marked provisional (``Ready.provisional``), and the router's
live step model, fed by the steps it serves, takes over:

- the rate flags: the operator's word (not provisional);
- a stored profile (``tandem profile``): registers at once;
- neither: a quick measurement, ``QUICK_STEPS`` decode steps at each batch size
  of the ladder after a ``QUICK_CONTEXT``-token prompt, the decode context's own
  prefill giving the prefill rate (a GPU, where that costs milliseconds: the full
  warm-up's shape after an untimed primer, ``quick_shape``), no batch size started
  past ``QUICK_BUDGET_S`` and none left running past ``QUICK_DEADLINE_S`` (a busy
  machine once took 15 s for the prompt and batch 1 alone).
  It is judged before it is advertised (``workers.sanity``), and its steps are
  not handed to the serving engine: the live model holds served steps only, so
  the router can tell the two apart and check one against the other.

MLX on a GPU still measures in full (``warm_up``): its first shapes compile
kernels, which the first requests it serves must not pay. A worker told
``--keep-profile`` (tandem serve's) stores its measurement where no profile is
stored (``workers.profiles.keep_start_rates``): its next start registers at once,
and serve compares engines by it (launcher/engines.py).

``Progress`` writes ``tandem worker --progress-json``'s lines: one JSON object per
line on stdout (``loading``, ``measuring``, ``registered``, ``error``), which
``tandem serve`` turns into its progress bars (launcher/screen.py).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

from tandem.workers.config import WorkerConfig
from tandem.workers.engine import Backend
from tandem.workers.profiler import WARMUP_CONTEXT, WARMUP_STEPS, WarmUp, step_ladder, warm_up
from tandem.workers.profiles import keep_start_rates
from tandem.workers.rates import measured_steps, rates, told_rates

log = logging.getLogger(__name__)

QUICK_CONTEXT = 256  # tokens each row decodes after: one prefill chunk of the default budget
QUICK_STEPS = 4  # decode steps timed per batch size: their median outvotes one stall
QUICK_BUDGET_S = 3.0  # no batch size is started past this (what is left is priced around it)
QUICK_DEADLINE_S = 6.0  # a batch size still running then is given up (a machine that busy)


class Progress:
    """``tandem worker --progress-json``: one JSON object per line on ``out``."""

    def __init__(self, enabled: bool, out: TextIO | None = None) -> None:
        self.enabled = enabled
        self.out = out or sys.stdout

    def __call__(self, event: str, **fields: Any) -> None:
        if not self.enabled:
            return
        try:
            self.out.write(json.dumps({"event": event, **fields}) + "\n")
            self.out.flush()
        except (OSError, ValueError):  # a reader that went away costs the worker nothing
            self.enabled = False


@dataclass(frozen=True)
class StartPrices:
    """The rates a worker registers with, and where they came from."""

    prefill_tok_s: float
    decode_tok_s: list[float]
    provisional: bool  # not yet borne out by steps served here
    adopt: WarmUp | None  # a full warm-up's steps, which the serving engine starts from
    decode_steps: tuple[int, ...] = ()  # batch sizes where the measured rate steps down


class Eta:
    """Seconds a measurement has left, for the worker's announcements: from the pace
    of its stages so far, never past a quick measurement's deadline; before the
    first stage ends, a quick one's budget (a full one: unknown)."""

    def __init__(self, quick: bool, clock: Callable[[], float] = time.monotonic) -> None:
        self.quick, self.clock, self.t0 = quick, clock, clock()

    def __call__(self, done: int, total: int) -> float | None:
        elapsed = self.clock() - self.t0
        pace = elapsed / done * max(0, total - done) if done > 0 else None
        if self.quick:
            pace = min(QUICK_BUDGET_S if pace is None else pace, QUICK_DEADLINE_S - elapsed)
        return None if pace is None else max(0.0, pace)


def quick_shape(device: str) -> dict[str, Any]:
    """What a quick measurement runs on ``device`` (``warm_up``'s keywords).

    A CPU: ``QUICK_STEPS`` decode steps after ``QUICK_CONTEXT`` tokens, its prefill
    priced from that context's own chunk (seconds matter: a 2-core machine prefills
    ~200 tok/s). A GPU prices a 512-token context in milliseconds, so it measures the
    full warm-up's shape (``WARMUP_CONTEXT``, ``WARMUP_STEPS``, a prefill probe of a
    full chunk), after an untimed primer: on the H200 the quick shape priced
    llama.cpp's GPU prefill at 0.68-0.79 of what it served, from one chunk that was
    the process's first GPU work, and its decode after 256 tokens where serving's
    rows held 516+. A GPU also measures every batch size up to 16 (``step_ladder``):
    llama.cpp's CUDA decode changes kernels past 8 rows (4.07 ms a step at 8, 6.08 at
    9 on the H200), which a ladder of powers of two priced smoothly at 0.59-0.67 of
    what 9-16 rows served. And it runs the whole ladder once untimed first (the
    ``compile_pass``, not only a primer): on the H200 the first sizes measured after
    the model's load stepped 1.3-1.9x slower than the same sizes later in the
    process (the GPU not yet up to speed), which hid the step at 9 behind a slow 8."""
    if device.startswith("gpu"):
        return {"context": WARMUP_CONTEXT, "measure_steps": WARMUP_STEPS,
                "prefill_probe": True, "primer": True, "ladder": step_ladder,
                "compile_pass": True}  # fmt: skip
    return {"context": QUICK_CONTEXT, "measure_steps": QUICK_STEPS, "prefill_probe": False,
            "compile_pass": False}  # fmt: skip


def start_prices(
    cfg: WorkerConfig,
    backend: Backend,
    worker_id: str,
    progress: Progress,
    announce: Callable[[str, float | None], None] | None = None,
) -> StartPrices:
    """Measure what ``cfg.measurement`` asks for (reporting each stage, and to
    ``announce(stage, eta_s)`` its seconds left) and price."""
    told = told_rates(cfg, backend)
    mode = cfg.measurement(backend.device, told is not None)
    eta = Eta(quick=mode == "quick")
    announce = announce or (lambda stage, eta_s: None)
    if mode != "none":
        announce("measuring", eta(0, 1))

    def stage(done: int, total: int) -> None:
        progress("measuring", worker_id=worker_id, done=done, total=total)
        announce("measuring", eta(done, total))

    warm = None
    if mode != "none":
        engine = cfg.engine
        if mode == "full":
            gpu = backend.device.startswith("gpu")
            slow = " (the first run on a machine compiles kernels: minutes)" if gpu else ""
            log.info("warming %s up and measuring it%s", backend.device, slow)
            warm = warm_up(backend, engine.max_active, engine.step_tokens, compile_pass=gpu,
                           progress=stage)  # fmt: skip
        else:
            log.info("measuring %s quickly (at most ~%.0f s)", backend.device, QUICK_BUDGET_S)
            warm = warm_up(
                backend, engine.max_active, engine.step_tokens,
                budget_s=QUICK_BUDGET_S, deadline_s=QUICK_DEADLINE_S, progress=stage,
                **quick_shape(backend.device),
            )  # fmt: skip
        log.info("measured %s in %.2f s", backend.device, warm.seconds)
    prefill, decode = rates(cfg, backend, warm)
    if cfg.keep_profile and warm is not None:
        keep_start_rates(backend, prefill, decode, f"{mode} start-up measurement")
    pinned = told is not None and told[2] == "the rate flags"
    simulated = backend.name == "sim" and mode == "none"  # its profile is its definition
    gpu = backend.device.startswith("gpu")
    steps = measured_steps(warm, cfg.engine.max_active) if gpu else ()
    if steps:
        log.info("measured a step down in decode rate at batch %s: priced as measured", steps)
    return StartPrices(prefill, decode, not (pinned or simulated),
                       warm if mode == "full" else None, steps)  # fmt: skip
