"""A worker process: build the backend, start the I/O thread, run the engine."""

from __future__ import annotations

import logging
import os
import queue
import signal
import socket
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from common import protocol as p
from workers.engine import Backend, Engine, EngineConfig
from workers.io import WorkerLink, start_link

log = logging.getLogger(__name__)

BACKENDS = ("llama.cpp", "mlx", "sim")
WARMUP = ("auto", "on", "off")
DEFAULT_PREFILL_TOK_S, DEFAULT_DECODE_TOK_S = 200.0, 50.0  # no profile, no flags: a guess


@dataclass(frozen=True)
class WorkerConfig:
    router: str
    backend: str = "llama.cpp"
    model: str | None = None  # None: the embedded default model
    worker_id: str | None = None
    device: str = "auto"
    threads: int = 2
    n_ctx: int = 8192
    engine: EngineConfig = field(default_factory=EngineConfig)
    prefill_tok_s: float | None = None  # None: from the stored profile, else a default
    decode_tok_s: tuple[float, ...] | None = None
    profile: str | None = None  # sim backend: its device profile file
    warmup: str = "auto"  # on | off | auto (on for GPU devices): see workers.profiler.warm_up

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, not {self.backend!r}")
        if self.threads < 1 or self.n_ctx < 64:
            raise ValueError("threads must be >= 1 and n_ctx >= 64")
        if self.prefill_tok_s is not None and self.prefill_tok_s <= 0:
            raise ValueError("prefill_tok_s must be > 0")
        if self.decode_tok_s is not None and (not self.decode_tok_s or min(self.decode_tok_s) <= 0):
            raise ValueError("decode_tok_s must be positive numbers")
        if self.warmup not in WARMUP:
            raise ValueError(f"warmup must be one of {WARMUP}, not {self.warmup!r}")

    def wants_warmup(self, device: str) -> bool:
        """auto: warm GPUs up (per-process kernel compilation); CPUs have nothing to warm."""
        return self.warmup == "on" or (self.warmup == "auto" and device.startswith("gpu"))

    def resolved_id(self, device: str) -> str:
        return self.worker_id or f"{device}-{socket.gethostname()}-{os.getpid()}"


def build_backend(cfg: WorkerConfig) -> Backend:
    from common.model_files import default_model_path

    model = Path(cfg.model) if cfg.model else default_model_path()
    if cfg.backend == "llama.cpp":
        from workers.llama_backend import LlamaBackend

        device = "cpu" if cfg.device == "auto" else cfg.device
        return LlamaBackend(
            model,
            n_ctx=cfg.n_ctx,
            threads=cfg.threads,
            max_active=cfg.engine.max_active,
            cache_entries=cfg.engine.cache_entries,
            step_tokens=cfg.engine.step_tokens,
            device=device,
        )
    if cfg.backend == "mlx":
        from workers.mlx_backend import MlxBackend

        return MlxBackend(model, n_ctx=cfg.n_ctx, device=cfg.device, engine=cfg.engine)
    from workers.sim_backend import SimBackend

    if not cfg.profile:
        raise ValueError("the sim backend needs --profile FILE")
    return SimBackend(cfg.profile, n_ctx=cfg.n_ctx, model=model)


def rates(cfg: WorkerConfig, backend: Backend) -> tuple[float, list[float]]:
    """Rates advertised in Ready: flags, else the stored profile, else a rough default."""
    from workers.profiles import stored_rates

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
    return prefill, decode[: cfg.engine.max_active]


def run_worker(cfg: WorkerConfig, stop: threading.Event | None = None) -> int:
    """Serve until SIGINT/SIGTERM (or ``stop``); returns a process exit code."""
    stop = stop or threading.Event()
    backend = build_backend(cfg)
    worker_id = cfg.resolved_id(backend.device)
    if cfg.wants_warmup(backend.device):
        from workers.profiler import warm_up

        log.info("warming %s up (the first run on a machine compiles kernels: minutes)",
                 backend.device)  # fmt: skip
        took = warm_up(backend, cfg.engine.max_active, cfg.engine.step_tokens)
        log.info("warmed %s up in %.2f s", backend.device, took)
    prefill, decode = rates(cfg, backend)
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
        tokenizer=backend.tokenizer_spec.to_wire(),
        max_tokens_limit=cfg.engine.max_tokens_limit,
        instance=uuid.uuid4().hex,
    )
    inbox: queue.Queue[p.Message] = queue.Queue()
    link = WorkerLink(cfg.router, ready, inbox)
    engine = Engine(backend, cfg.engine, link.emit, worker_id, inbox)
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
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


def _watch_fatal(link: WorkerLink, stop: threading.Event) -> None:
    while not stop.wait(0.2):
        if link.fatal:
            stop.set()
