"""What the router core owes its peers, held until its driver sends it.

The core (broker/core.py) never sends: each message it owes a peer is appended
here, per peer in order, and the driver takes the lot at the end of a phase —
the live loop hands it to the sockets as one frame per peer (broker/router.py
``_flush``), the twin delivers it on its virtual clock (twin/loop.py). Appending
costs what queueing on the socket did (a dict lookup and a list append).
"""

from __future__ import annotations

from typing import Any

from tandem.common import protocol as p

Held = dict[bytes, list[p.Message]]  # peer identity -> messages, in the order owed


class Outgoing:
    """Messages for workers and clients, and decision records, not yet handed over."""

    __slots__ = ("workers", "clients", "decisions")

    def __init__(self) -> None:
        self.workers: Held = {}
        self.clients: Held = {}
        self.decisions: list[tuple[float, dict[str, Any]]] = []  # (now, record)

    def to_worker(self, identity: bytes, msg: p.Message) -> None:
        self.workers.setdefault(identity, []).append(msg)

    def to_client(self, identity: bytes, msg: p.Message) -> None:
        self.clients.setdefault(identity, []).append(msg)

    def take_workers(self) -> Held:
        held, self.workers = self.workers, {}
        return held

    def take_clients(self) -> Held:
        held, self.clients = self.clients, {}
        return held

    def take_decisions(self) -> list[tuple[float, dict[str, Any]]]:
        taken, self.decisions = self.decisions, []
        return taken
