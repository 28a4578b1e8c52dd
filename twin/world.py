"""The twin's virtual clock: one event heap, the router and the workers on it.

A worker is the real ``Engine`` over a ``TwinDevice``. Its loop is the worker
process's loop (workers/engine.py ``run``) cut into events: at a tick it
drains its inbox, runs one step (the device moves the worker's clock by the
step's cost) and heartbeats if due; what the engine emitted leaves as the frames
a worker's link sends (workers/frames.py, the encoder the I/O thread runs) and
reaches the router when the step ends (plus ``latency_s``; heartbeats may be held
back longer, to test stale views). A busy worker ticks again when its step ends; an idle one
sleeps until a message arrives. Nothing sleeps and nothing opens a socket, so
virtual hours replay in seconds.
"""

from __future__ import annotations

import heapq
import itertools
import queue
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tandem.common import protocol as p
from tandem.twin.device import Tail, twin_device
from tandem.workers import frames
from tandem.workers.device_model import SimProfile
from tandem.workers.engine import Engine, EngineConfig


@dataclass(frozen=True)
class Links:
    """Message delays of the twin (seconds of virtual time)."""

    latency_s: float = 0.0  # every message, both ways
    heartbeat_delay_s: float = 0.0  # extra on heartbeats: the router sees stale load

    def __post_init__(self) -> None:
        if self.latency_s < 0 or self.heartbeat_delay_s < 0:
            raise ValueError("latency_s and heartbeat_delay_s must be >= 0")


NO_DELAY = Links()


class World:
    """An event heap on a virtual clock; ``at(t, fn, *args)`` runs ``fn(*args)`` at ``t``."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = itertools.count()  # equal times keep the order they were scheduled in
        self.events = 0

    def at(self, t: float, fn: Callable[..., None], *args: Any) -> None:
        heapq.heappush(self._heap, (max(t, self.now), next(self._seq), fn, args))

    def run(self, until: Callable[[], bool] | None = None, max_events: int = 50_000_000) -> None:
        """Process events in time order until none are left or ``until()`` holds."""
        heap = self._heap
        while heap and self.events < max_events:
            t, _, fn, args = heapq.heappop(heap)
            self.now = t
            self.events += 1
            fn(*args)
            if until is not None and until():
                return
        if heap:
            raise RuntimeError(f"the twin stopped after {max_events} events")


class TwinWorker:
    """One worker: the real engine over a virtual device, ticked by the world."""

    def __init__(
        self,
        world: World,
        worker_id: str,
        profile: SimProfile,
        engine: EngineConfig,
        deliver: Callable[[str, list[bytes]], None],  # (worker id, frames)
        links: Links,
        tail: Tail | None = None,
    ) -> None:
        self.world = world
        self.worker_id = worker_id
        self.now = 0.0
        self.device = twin_device(profile, self, engine, tail)
        self.inbox: queue.SimpleQueue[p.Message] = queue.SimpleQueue()
        self._out: list[p.Message] = []
        self.engine = Engine(
            self.device, engine, self._out.append, worker_id, self.inbox, clock=self._clock
        )
        self.deliver = deliver
        self.links = links
        self._ticking = False

    def _clock(self) -> float:
        return self.now

    def ready(self, rates: tuple[float, list[float]] | None = None) -> p.Ready:
        """The Ready this worker sends; ``rates`` (prefill, decode by batch) overrides
        what it advertises (the profile's own rates otherwise)."""
        prof = self.device.profile
        prefill, decode = rates or (prof.prefill_tok_s, prof.decode_tok_s())
        cfg = self.engine.cfg
        return p.Ready(
            self.worker_id, "sim", self.device.device, "twin", cfg.max_active,
            self.device.n_ctx, cfg.block_size, prefill, list(decode),
            cfg.heartbeat_s, {}, cfg.max_tokens_limit, step_tokens=cfg.step_tokens,
        )  # fmt: skip

    def receive(self, msg: p.Message) -> None:
        """A message from the router arrives now (world time)."""
        self.inbox.put(msg)
        if not self._ticking:
            self._ticking = True
            self.world.at(self.world.now, self.tick)

    def tick(self) -> None:
        """One pass of the worker loop at world time: drain, step, heartbeat."""
        self.now = max(self.now, self.world.now)
        eng = self.engine
        eng.drain_inbox(block=False)
        if eng.queue or eng.active:
            eng.step()
        eng.maybe_heartbeat()
        self._flush()
        if eng.queue or eng.active or not self.inbox.empty():
            self.world.at(self.now, self.tick)
        else:
            self._ticking = False

    def _flush(self) -> None:
        """What the step emitted, as its link would frame it, on its way to the router."""
        if not self._out:
            return
        rest: list[bytes] = []
        beats: list[bytes] = []
        frames.encode(self._out, rest.append, beats.append)
        self._out.clear()
        t = self.now + self.links.latency_s
        if rest:
            self.world.at(t, self.deliver, self.worker_id, rest)
        if beats:
            self.world.at(t + self.links.heartbeat_delay_s, self.deliver, self.worker_id, beats)
