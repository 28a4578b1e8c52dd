"""Workers the router has heard from but that have not registered yet: starting.

A worker loads its model and may measure itself before it can send its Ready
(seconds to minutes); meanwhile it announces itself (``Starting``, repeated every
``every_s``) so that what waits for it can say for whom and how long: ``tandem
status`` and ``top`` list it, a held request's waiting line names it, the gateway's
/health and /v1/models say "starting" with it. The list is informational only:
nothing is routed by it, and its Ready is judged as any other (a duplicate id is
refused then, on both sides).

Rules, by worker id:

- the newest announcement of an id replaces the last (a restarted worker announces
  under its predecessor's id with a new instance);
- its Ready, welcomed or refused, removes it (``registered`` / ``refused``);
- an announcement from the instance already registered under that id arrived
  after its Ready (the two travel on separate connections): ignored;
- silent past its window (``max(floor_s, WINDOWS * every_s)``): forgotten, as a
  silent worker is expired;
- an id a live worker holds is kept but not shown: the status shows the
  registered one (the newcomer is a restart waiting for the id, or a duplicate that
  its Ready will have refused).
"""

from __future__ import annotations

import logging
from collections.abc import Container
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("tandem.broker.router")

WINDOWS = 6  # announcements missed before a starting worker is forgotten (as heartbeats)
MAX_STARTING = 1024  # ids kept at most: announcements past it are not listed


@dataclass
class StartingWorker:
    """One starting worker, as its last announcement said."""

    worker_id: str
    instance: str
    device: str
    model: str
    stage: str
    eta_s: float | None  # its estimate when it announced, None: it does not know
    every_s: float
    since: float  # when the router first heard of this instance
    last_seen: float

    def row(self, now: float) -> dict[str, Any]:
        """Its row in the status reply (``StatusReply.starting``)."""
        eta = None if self.eta_s is None else max(0.0, self.eta_s - (now - self.last_seen))
        return {
            "id": self.worker_id,
            "state": "starting",
            "device": self.device,
            "model": self.model,
            "stage": self.stage,
            "eta_s": None if eta is None else round(eta, 1),
            "starting_for_s": round(now - self.since, 1),
            "last_seen_s": round(now - self.last_seen, 3),
        }


class StartingList:
    """The starting workers by id; see the module docstring."""

    def __init__(self, floor_s: float) -> None:
        self.floor_s = floor_s
        self.workers: dict[str, StartingWorker] = {}

    def announce(
        self,
        worker_id: str,
        instance: str,
        *,
        device: str,
        model: str,
        stage: str,
        eta_s: float | None,
        every_s: float,
        now: float,
    ) -> None:
        old = self.workers.get(worker_id)
        if old is None and len(self.workers) >= MAX_STARTING:
            return
        since = old.since if old is not None and old.instance == instance else now
        if old is None or old.instance != instance:
            log.info("worker %s starting on %s (%s)", worker_id, device, stage)
        self.workers[worker_id] = StartingWorker(
            worker_id, instance, device, model, stage, eta_s, every_s, since, now
        )

    def registered(self, worker_id: str, instance: str) -> None:
        """``worker_id``'s Ready from ``instance`` was welcomed: no longer starting."""
        self._drop(worker_id, instance)

    def refused(self, worker_id: str, instance: str) -> None:
        """``instance``'s Ready was refused: it stops, and is not starting any more."""
        self._drop(worker_id, instance)

    def _drop(self, worker_id: str, instance: str) -> None:
        w = self.workers.get(worker_id)
        if w is not None and (w.instance == instance or not instance):
            del self.workers[worker_id]

    def expire(self, now: float) -> list[str]:
        """Forget the workers silent past their window; returns their ids."""
        gone = [
            w.worker_id
            for w in self.workers.values()
            if now - w.last_seen > max(self.floor_s, WINDOWS * w.every_s)
        ]
        for wid in gone:
            w = self.workers.pop(wid)
            log.warning("starting worker %s forgotten: silent for %.1f s (it was %s)",
                        wid, now - w.last_seen, w.stage)  # fmt: skip
        return gone

    def rows(self, now: float, registered: Container[str] = ()) -> list[dict[str, Any]]:
        """The status rows of those not registered under their id, by id."""
        return [w.row(now) for wid, w in sorted(self.workers.items()) if wid not in registered]
