"""Replay one workload through the twin: workers join, the prefix is seeded, requests arrive.

The same protocol as one bench run (bench/experiment.py ``run_once``): every
worker starts, the workload's prefix is prefilled into each worker's cache
(pinned, prefill-only), then the arrivals come ``LEAD_S`` later at their
offsets, and the client records what it sees. Only here the clock is virtual.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tandem.bench.driver import LEAD_S, RequestRecord
from tandem.bench.workload import Arrival, PromptBook
from tandem.common import protocol as p
from tandem.twin.cache import CacheSpec
from tandem.twin.device import Tail, TwinDevice
from tandem.twin.loop import TwinLoop
from tandem.twin.world import NO_DELAY, Links, TwinWorker, World
from tandem.workers.device_model import SimProfile
from tandem.workers.engine import EngineConfig
from tandem.workers.profiler import WarmUp, warm_up
from tandem.workers.rates import measured_rates


@dataclass(frozen=True)
class TwinWorkerSpec:
    """One simulated worker of the twin."""

    worker_id: str
    profile: SimProfile  # what its device really does
    max_active: int = 4
    # What it advertises in Ready (prefill tok/s, decode tok/s by batch); None: the
    # profile's own rates. A wrong price is how the robustness suite fools a policy.
    advertised: tuple[float, tuple[float, ...]] | None = None
    join_s: float | None = None  # joins this long after the first arrival (None: at start)
    # Measures itself before it registers, as a real worker does by default
    # (workers.profiler.warm_up, here on the virtual clock): the measurement, not the
    # advertised rates, is what its Ready says where it measured.
    warmup: bool = False
    step_tokens: int = 256
    heartbeat_s: float = 0.5
    n_ctx: int = 1 << 20
    tail: Tail | None = None  # its steps right-skewed (twin/device.py)
    cache: CacheSpec = CacheSpec()  # its prefix cache flags (twin/cache.py)

    def __post_init__(self) -> None:
        if not self.worker_id or self.max_active < 1 or self.heartbeat_s <= 0:
            raise ValueError("need a worker id, max_active >= 1 and heartbeat_s > 0")
        if self.join_s is not None and self.join_s < 0:
            raise ValueError("join_s must be >= 0")

    def engine(self) -> EngineConfig:
        return EngineConfig(
            max_active=self.max_active,
            step_tokens=self.step_tokens,
            heartbeat_s=self.heartbeat_s,
            **self.cache.engine_fields(self.profile),
        )


@dataclass
class Replay:
    """What one replay produced: client records, routing decisions, seed stats."""

    records: list[RequestRecord]
    decisions: list[dict[str, Any]]
    seeds: dict[str, dict[str, Any]] = field(default_factory=dict)
    events: int = 0
    virtual_s: float = 0.0
    caches: dict[str, dict[str, Any]] = field(default_factory=dict)  # per worker, at the end


def replay(
    specs: Sequence[TwinWorkerSpec],
    policy: str,
    arrivals: Sequence[Arrival],
    book: PromptBook,
    *,
    seed_prefix: bool = True,
    calibrate: bool = True,
    decode_estimate: str = "budget",
    links: Links = NO_DELAY,
    placement: Mapping[int, str] | None = None,
) -> Replay:
    """Run ``arrivals`` under ``policy`` on ``specs``; returns when every request ended.
    ``placement``: arrival index -> worker id, pinning those requests (twin/oracle.py)."""
    world = World()
    workers: dict[str, TwinWorker] = {}

    def to_worker(wid: str, msg: p.Message, now: float) -> None:
        world.at(now + links.latency_s, workers[wid].receive, msg)

    router = TwinLoop(policy, to_worker, calibrate, decode_estimate)

    def to_router(wid: str, frames: list[bytes]) -> None:
        router.on_worker(wid, frames, world.now)

    def join(spec: TwinWorkerSpec) -> None:
        w = workers[spec.worker_id] = TwinWorker(
            world, spec.worker_id, spec.profile, spec.engine(), to_router, links, spec.tail
        )
        w.now = world.now
        rates = (spec.advertised[0], list(spec.advertised[1])) if spec.advertised else None
        if spec.warmup:
            prof = spec.profile
            told = rates or (prof.prefill_tok_s, list(prof.decode_tok_s()))
            warm = _warm_up(spec)
            rates = measured_rates(*told, warm, "the advertised rates", spec.max_active)
            w.engine.timer.adopt(warm.stats)
        router.register(w.ready(rates), world.now)

    start = [s for s in specs if s.join_s is None]
    for spec in start:
        join(spec)
    seeds: dict[str, RequestRecord] = {}
    if seed_prefix and start:
        for spec in start:
            rec = seeds[spec.worker_id] = RequestRecord(-1, f"seed-{spec.worker_id}", True, 0.0)
            router.submit(rec, book.prefix, 1, 0.0, worker=spec.worker_id, prefill_only=True)
        world.run(until=lambda: router.ended >= len(seeds))
    t0 = world.now + LEAD_S
    for spec in specs:
        if spec.join_s is not None:
            world.at(t0 + spec.join_s, join, spec)
    recs = [RequestRecord(a.index, f"bench-{a.index}", a.hit, t0 + a.offset_s) for a in arrivals]
    pins = placement or {}
    for rec, a in zip(recs, arrivals, strict=True):
        world.at(rec.scheduled_s, _arrive, router, rec, book, a, pins.get(a.index))
    world.run(until=lambda: router.ended >= len(seeds) + len(recs))
    return Replay(
        recs,
        router.decisions,
        {w: r.stats for w, r in seeds.items()},
        world.events,
        world.now,
        {wid: cache_use(w, spec.cache.kv_bytes) for wid, w, spec in _joined(workers, specs)},
    )


def _joined(
    workers: dict[str, TwinWorker], specs: Sequence[TwinWorkerSpec]
) -> list[tuple[str, TwinWorker, TwinWorkerSpec]]:
    return [(s.worker_id, workers[s.worker_id], s) for s in specs if s.worker_id in workers]


def cache_use(w: TwinWorker, kv_bytes: int) -> dict[str, Any]:
    """A worker's prefix cache by tier: capacity and tokens held, and those in bytes
    (the memory the twin charges: ``kv_bytes`` a token)."""
    cache = w.engine.cache
    out: dict[str, Any] = {"policy": cache.policy, "max_entries": cache.max_entries}
    for tier, cap in cache.capacity.items():
        held = cache.held[tier]
        out[tier] = {"capacity_tokens": cap, "held_tokens": held, "entries": cache.counts[tier],
                     "capacity_bytes": cap * kv_bytes, "held_bytes": held * kv_bytes}  # fmt: skip
    out["restored_tokens"] = getattr(w.device, "restored_tokens", 0)
    return out


class _Scratch:
    now = 0.0


def _warm_up(spec: TwinWorkerSpec) -> WarmUp:
    """The worker's start-up measurement on a device of its own, on its own clock
    (before it registers, so the world's clock does not move)."""
    owner = _Scratch()
    device = TwinDevice(spec.profile, owner, spec.n_ctx, spec.tail)
    return warm_up(
        device, spec.max_active, spec.step_tokens, compile_pass=False, clock=lambda: owner.now
    )


def _arrive(
    router: TwinLoop, rec: RequestRecord, book: PromptBook, a: Arrival, pin: str | None
) -> None:
    router.submit(rec, book.prompt(a), a.output_tokens, rec.scheduled_s, worker=pin)
