"""What the router core owes its peers, held until its driver sends it.

The core (broker/core.py) never sends: each message it owes a peer is appended
here, per peer in order, and at the end of a phase the core's ``flush`` hands the
lot to the driver's ``Peers`` — the live loop's sockets, one frame per peer
(broker/router.py), the twin's virtual links (twin/loop.py), a bench or a test
that keeps or drops it. Appending costs what queueing on the socket did (a dict
lookup and a list append).
"""

from __future__ import annotations

from typing import Any, Protocol

from tandem.common import protocol as p

Held = dict[bytes, list[p.Message]]  # peer identity -> messages, in the order owed
Lost = list[tuple[bytes, list[p.Message]]]  # peers that could not be reached, what they missed
Records = list[tuple[float, dict[str, Any]]]  # decision records, each with its time


class Peers(Protocol):
    """Where a driver sends what the core owes (``RouterCore.flush``), at ``now``."""

    def to_workers(self, held: Held, now: float) -> Lost:
        """Send ``held`` to the workers; the ones it could not reach, with their part."""
        ...

    def to_clients(self, held: Held, now: float) -> Lost:
        """Send ``held`` to the clients; the ones it could not reach, with their part."""
        ...

    def write_decisions(self, records: Records, now: float) -> None:
        """Keep or write the decision records made since the last flush."""
        ...


class Outgoing:
    """Messages for workers and clients, and decision records, not yet handed over."""

    __slots__ = ("workers", "clients", "decisions")

    def __init__(self) -> None:
        self.workers: Held = {}
        self.clients: Held = {}
        self.decisions: Records = []

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

    def take_decisions(self) -> Records:
        taken, self.decisions = self.decisions, []
        return taken


class Kept:
    """``Peers`` for a driver without links (the router bench, tests driving the core
    alone): what is handed over is kept in order, as (peer, message), and nothing is
    ever lost."""

    def __init__(self) -> None:
        self.workers: list[tuple[bytes, p.Message]] = []
        self.clients: list[tuple[bytes, p.Message]] = []
        self.records: Records = []

    def to_workers(self, held: Held, now: float) -> Lost:
        self.workers += [(peer, msg) for peer, msgs in held.items() for msg in msgs]
        return []

    def to_clients(self, held: Held, now: float) -> Lost:
        self.clients += [(peer, msg) for peer, msgs in held.items() for msg in msgs]
        return []

    def write_decisions(self, records: Records, now: float) -> None:
        self.records += records
