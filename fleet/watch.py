"""Which workers the fleet's router lists, watched from the driver on a thread of
its own (a router being restarted makes a status call wait; the driver's loop,
which tells the agents where the router went, must not)."""

from __future__ import annotations

import queue
import threading
from pathlib import Path
from typing import Any

from tandem.fleet.plans import RouterAddress

POLL_S = 0.5
CHANGES_KEPT = 1000  # events not yet shown; more are dropped (nothing reads them)


class Registrations:
    def __init__(self, keys: Path) -> None:
        self.keys = keys
        self._where: RouterAddress | None = None
        self._have: dict[str, dict[str, Any]] = {}
        self._changes: queue.Queue[tuple[str, str, str]] = queue.Queue(CHANGES_KEPT)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tandem-fleet-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def point(self, where: RouterAddress) -> None:
        self._where = where

    def registered(self) -> set[str]:
        return set(self._have)

    def changes(self) -> list[tuple[str, str, str]]:
        """(kind, worker id, text) since the last call: a worker registered or left."""
        out = []
        while not self._changes.empty():
            out.append(self._changes.get_nowait())
        return out

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)

    def _run(self) -> None:
        from tandem.client.errors import TandemError
        from tandem.client.sync import Client

        client, at = None, None
        while not self._stop.wait(POLL_S):
            where = self._where
            if where is None:
                continue
            if client is None or at != where.client:
                if client is not None:
                    client.close()
                client, at = Client(where.client, timeout_s=2.0, connect_timeout_s=1.0,
                                    retries=0, keys=str(self.keys)), where.client  # fmt: skip
            try:
                rows = client.status().workers
            except TandemError:
                client.close()
                client = None  # a fresh socket next time
                continue
            self._update({str(r["id"]): r for r in rows})
        if client is not None:
            client.close()

    def _update(self, now: dict[str, dict[str, Any]]) -> None:
        for wid in now.keys() - self._have.keys():
            row = now[wid]
            self._put(("up", wid, f"registered: {row.get('backend')} on {row.get('device')}"))
        for wid in self._have.keys() - now.keys():
            self._put(("down", wid, "out of routing"))
        self._have = now

    def _put(self, change: tuple[str, str, str]) -> None:
        if not self._changes.full():
            self._changes.put_nowait(change)
