"""A worker process: build the backend, start the I/O thread, run the engine."""

from __future__ import annotations

import logging
import os
import queue
import signal
import threading
import uuid

from tandem.common import protocol as p
from tandem.common.affinity import pin
from tandem.common.settings import env_str
from tandem.workers.backends import build_backend
from tandem.workers.config import WorkerConfig
from tandem.workers.engine import Backend, Engine
from tandem.workers.io import WorkerLink, start_link
from tandem.workers.rates import rates

log = logging.getLogger(__name__)

EXIT_GRACE_S = 1.5  # SIGTERM/SIGINT to exit: the clean path, else a hard exit


def run_worker(cfg: WorkerConfig, stop: threading.Event | None = None) -> int:
    """Serve until SIGINT/SIGTERM (or ``stop``); returns a process exit code."""
    stop = stop or threading.Event()
    pin(cfg.cpus)  # before the backend starts its threads: they inherit it
    backend = build_backend(cfg)
    worker_id = cfg.resolved_id(backend.device)
    warm = None
    if cfg.wants_warmup(backend.device):
        from tandem.workers.profiler import warm_up

        gpu = backend.device.startswith("gpu")
        slow = " (the first run on a machine compiles kernels: minutes)" if gpu else ""
        log.info("warming %s up and measuring it%s", backend.device, slow)
        warm = warm_up(backend, cfg.engine.max_active, cfg.engine.step_tokens, compile_pass=gpu)
        log.info("warmed %s up in %.2f s", backend.device, warm.seconds)
    prefill, decode = rates(cfg, backend, warm)
    ready = ready_message(cfg, backend, worker_id, prefill, decode)
    inbox: queue.Queue[p.Message] = queue.Queue()
    from tandem.common.auth import peer_setup

    link = WorkerLink(cfg.router, ready, inbox, setup=peer_setup(cfg.keys, "worker"))
    engine = Engine(backend, cfg.engine, link.emit, worker_id, inbox)
    if warm is not None:  # the router's live model starts from the measurement
        engine.timer.adopt(warm.stats)
    trace_dir = env_str("STEP_TRACE_DIR", "")
    if trace_dir:  # every step this worker serves, to a CSV of its own (workers/steptimer.py)
        path = os.path.join(trace_dir, f"{worker_id}-{os.getpid()}.csv")
        try:
            os.makedirs(trace_dir, exist_ok=True)
            engine.timer.trace_to(path)
            log.info("tracing steps to %s", path)
        except OSError as exc:  # a diagnostic: the worker serves without it
            log.warning("cannot trace steps to %s: %s", path, exc)
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: _stop_within(stop, EXIT_GRACE_S))
    io_thread = start_link(link, stop)
    log.info(
        "worker %s (%s on %s, model %s) -> %s",
        worker_id,
        backend.name,
        backend.device,
        backend.model_name,
        cfg.router,
    )
    watchdog = threading.Thread(target=_watch_fatal, args=(link, stop), daemon=True)
    watchdog.start()
    try:
        engine.run(stop)
    finally:
        stop.set()
        io_thread.join(timeout=2)
        engine.timer.close_trace()
    if link.fatal:
        log.error("router refused this worker: %s", link.fatal)
        return 2
    return 0


def ready_message(
    cfg: WorkerConfig, backend: Backend, worker_id: str, prefill: float, decode: list[float]
) -> p.Ready:
    """The Ready this worker registers with: what it is, its limits, its rates."""
    spec = backend.tokenizer_spec.to_wire()
    return p.Ready(
        worker_id=worker_id,
        backend=backend.name,
        device=backend.device,
        model=backend.model_name,
        max_active=cfg.engine.max_active,
        n_ctx=backend.n_ctx,
        block_size=cfg.engine.block_size,
        prefill_tok_s=prefill,
        decode_tok_s=decode,
        heartbeat_s=cfg.engine.heartbeat_s,
        tokenizer=spec,
        max_tokens_limit=cfg.engine.max_tokens_limit,
        instance=uuid.uuid4().hex,
        tokenizer_hash=p.tokenizer_hash(spec),
        step_tokens=cfg.engine.step_tokens,
        weights=backend.weights_digest,
    )


def _stop_within(stop: threading.Event, grace_s: float) -> None:
    """Ask the loops to stop, and make sure the process is gone ``grace_s`` later.

    The engine stops after its current step and the I/O thread says Goodbye, so the
    router re-routes or fails what this worker held. A step inside a native library
    (a long llama.cpp prefill, an MLX kernel compilation) cannot be interrupted, so a
    timer ends the process if the clean path has not by then.
    """
    if stop.is_set():
        return
    stop.set()

    def hard_exit() -> None:
        log.error("still running %.1f s after the stop signal: exiting now", grace_s)
        logging.shutdown()
        os._exit(1)

    timer = threading.Timer(grace_s, hard_exit)
    timer.daemon = True
    timer.start()


def _watch_fatal(link: WorkerLink, stop: threading.Event) -> None:
    while not stop.wait(0.2):
        if link.fatal:
            stop.set()
