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
from tandem.common.model_files import DEFAULT_MODEL_FILE
from tandem.common.settings import env_str
from tandem.workers.announce import announce
from tandem.workers.backends import build_backend
from tandem.workers.config import WorkerConfig
from tandem.workers.engine import Backend, Engine
from tandem.workers.host_cache import size_worker
from tandem.workers.io import WorkerLink, start_link
from tandem.workers.startup import Progress, start_prices

log = logging.getLogger(__name__)

EXIT_GRACE_S = 1.5  # SIGTERM/SIGINT to exit: the clean path, else a hard exit


def run_worker(cfg: WorkerConfig, stop: threading.Event | None = None) -> int:
    """Serve until SIGINT/SIGTERM (or ``stop``); returns a process exit code."""
    stop = stop or threading.Event()
    progress = Progress(cfg.progress_json)
    progress("loading", worker_id=cfg.worker_id, model=cfg.model or DEFAULT_MODEL_FILE)
    instance = uuid.uuid4().hex  # the Ready's too: the router ties the two together
    # The router hears of a starting worker at once when its id is known, else once
    # the backend has named its device (the id's default names it).
    announcer = announce(cfg, cfg.worker_id, instance, cfg.device) if cfg.worker_id else None
    try:
        pin(cfg.cpus)  # before the backend starts its threads: they inherit it
        cfg = size_worker(cfg)  # the prefix cache's sizes, from the device's memory
        backend = build_backend(cfg)
        worker_id = cfg.resolved_id(backend.device)
        announcer = announcer or announce(cfg, worker_id, instance, backend.device)
        announcer.device = backend.device
        prices = start_prices(cfg, backend, worker_id, progress, announcer.stage)
        announcer.stage(p.StartStage.REGISTERING, 0.0)
    except Exception as exc:  # the CLI prints it; a supervisor reads the event
        progress("error", worker_id=cfg.worker_id, message=str(exc))
        raise
    finally:
        if announcer is not None:  # the Ready replaces it (or the worker stops)
            announcer.close()
    ready = ready_message(
        cfg, backend, worker_id, prices.prefill_tok_s, prices.decode_tok_s, prices.provisional,
        instance, decode_steps=prices.decode_steps,
    )  # fmt: skip
    inbox: queue.Queue[p.Message] = queue.Queue()
    from tandem.common.auth import peer_setup
    from tandem.workers.follow import RouterFile

    follow = RouterFile(cfg.router_file, cfg.router) if cfg.router_file else None
    link = WorkerLink(
        cfg.router, ready, inbox, setup=peer_setup(cfg.keys, "worker"), router_file=follow
    )
    engine = Engine(backend, cfg.engine, link.emit, worker_id, inbox)
    if prices.adopt is not None:  # the router's live model starts from a full warm-up
        engine.timer.adopt(prices.adopt.stats)
    _trace_steps(engine, worker_id)
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: _stop_within(stop, EXIT_GRACE_S))
    io_thread = start_link(link, stop)
    log.info(
        "worker %s (%s on %s, model %s) -> %s%s",
        worker_id,
        backend.name,
        backend.device,
        backend.model_name,
        cfg.router,
        " (provisional prices)" if prices.provisional else "",
    )
    watchdog = threading.Thread(target=_watch, args=(link, stop, progress), daemon=True)
    watchdog.start()
    try:
        engine.run(stop)
    finally:
        stop.set()
        io_thread.join(timeout=2)
        engine.timer.close_trace()
    if link.fatal:
        log.error("router refused this worker: %s", link.fatal)
        progress("error", worker_id=worker_id, message=f"router refused this worker: {link.fatal}")
        return 2
    return 0


def _trace_steps(engine: Engine, worker_id: str) -> None:
    """Every step this worker serves, to a CSV of its own (workers/steptimer.py)."""
    trace_dir = env_str("STEP_TRACE_DIR", "")
    if not trace_dir:
        return
    path = os.path.join(trace_dir, f"{worker_id}-{os.getpid()}.csv")
    try:
        os.makedirs(trace_dir, exist_ok=True)
        engine.timer.trace_to(path)
        log.info("tracing steps to %s", path)
    except OSError as exc:  # a diagnostic: the worker serves without it
        log.warning("cannot trace steps to %s: %s", path, exc)


def ready_message(
    cfg: WorkerConfig,
    backend: Backend,
    worker_id: str,
    prefill: float,
    decode: list[float],
    provisional: bool = False,
    instance: str | None = None,
    decode_steps: tuple[int, ...] = (),
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
        instance=instance or uuid.uuid4().hex,
        tokenizer_hash=p.tokenizer_hash(spec),
        step_tokens=cfg.engine.step_tokens,
        weights=backend.weights_digest,
        provisional=provisional,
        capabilities=list(backend.capabilities),  # what the router may route here
        node=cfg.node,
        decode_steps=list(decode_steps),  # measured steps down: the router keeps them
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


def _watch(link: WorkerLink, stop: threading.Event, progress: Progress) -> None:
    """Stop on a fatal refusal; say "registered" each time the router welcomes us."""
    registered = False
    while not stop.wait(0.05):
        if link.fatal:
            stop.set()
        elif link.registered.is_set() != registered:
            registered = not registered
            if registered:
                progress("registered", worker_id=link.ready.worker_id,
                         provisional=link.ready.provisional)  # fmt: skip
