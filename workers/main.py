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
from tandem.workers.backends import build_backend
from tandem.workers.config import DEFAULT_DECODE_TOK_S, DEFAULT_PREFILL_TOK_S, WorkerConfig
from tandem.workers.engine import Backend, Engine
from tandem.workers.io import WorkerLink, start_link

log = logging.getLogger(__name__)

EXIT_GRACE_S = 1.5  # SIGTERM/SIGINT to exit: the clean path, else a hard exit


def rates(cfg: WorkerConfig, backend: Backend) -> tuple[float, list[float]]:
    """Rates advertised in Ready: flags, else the stored profile, else a rough default."""
    from tandem.workers.profiles import stored_rates

    # A simulated device's profile file is its definition: advertise exactly that.
    stored = getattr(backend, "profile_rates", None) or stored_rates(backend)
    if stored is None and not (cfg.prefill_tok_s and cfg.decode_tok_s):
        log.warning(
            "no stored profile for %s on %s (%s): advertising rough default rates. Routing "
            "between unlike workers prices this one wrongly until `tandem profile --backend "
            "%s --device %s` has run here (the router's calibration can only correct it as "
            "requests are served).",
            backend.name, backend.device, backend.model_name, backend.name, cfg.device,
        )  # fmt: skip
    prefill = cfg.prefill_tok_s or (stored[0] if stored else DEFAULT_PREFILL_TOK_S)
    decode = list(cfg.decode_tok_s or (stored[1] if stored else [DEFAULT_DECODE_TOK_S]))
    while len(decode) < cfg.engine.max_active:
        decode.append(decode[-1])  # no data beyond this batch size: assume a plateau
    decode = decode[: cfg.engine.max_active]
    _warn_if_suspicious(decode, "--decode-tok-s" if cfg.decode_tok_s else "the stored profile")
    return prefill, decode


def _warn_if_suspicious(decode: list[float], source: str) -> None:
    """A stall caught in a profile (one bad point, or a dip with batch size) misprices
    the worker until live step times replace it: say so where the operator looks."""
    from tandem.common.ratefit import explain, fit_decode_rates

    problems = explain(decode, fit_decode_rates(decode))
    if problems:
        log.warning(
            "decode rates from %s look wrong: %s. The router repairs them and prices from "
            "live step times once requests run; re-run `tandem profile` on an idle machine.",
            source,
            "; ".join(problems),
        )


def run_worker(cfg: WorkerConfig, stop: threading.Event | None = None) -> int:
    """Serve until SIGINT/SIGTERM (or ``stop``); returns a process exit code."""
    stop = stop or threading.Event()
    pin(cfg.cpus)  # before the backend starts its threads: they inherit it
    backend = build_backend(cfg)
    worker_id = cfg.resolved_id(backend.device)
    if cfg.wants_warmup(backend.device):
        from tandem.workers.profiler import warm_up

        log.info("warming %s up (the first run on a machine compiles kernels: minutes)",
                 backend.device)  # fmt: skip
        took = warm_up(backend, cfg.engine.max_active, cfg.engine.step_tokens)
        log.info("warmed %s up in %.2f s", backend.device, took)
    prefill, decode = rates(cfg, backend)
    spec = backend.tokenizer_spec.to_wire()
    ready = p.Ready(
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
    inbox: queue.Queue[p.Message] = queue.Queue()
    from tandem.common.auth import peer_setup

    link = WorkerLink(cfg.router, ready, inbox, setup=peer_setup(cfg.keys, "worker"))
    engine = Engine(backend, cfg.engine, link.emit, worker_id, inbox)
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
    if link.fatal:
        log.error("router refused this worker: %s", link.fatal)
        return 2
    return 0


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
