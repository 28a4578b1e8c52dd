"""Who a request belongs to and who a worker is, across router restarts.

Worker-side request ids are ``<epoch>.<n>``: the epoch is random per router
start, so an id handed out before a restart can never name a request of the new
router (a counter alone restarts at 0 and made a restarted router relay one
request's tokens into another's stream). The router accepts tokens, Done and
Error for an id only from the worker it assigned that id to.

Workers drop, rather than finish, what an earlier registration gave them: when
a worker registers again (the router restarted, or expired it) the router has
already failed or re-routed those requests, so finishing them would only spend
the device on output nobody reads (workers/io.py sends the engine a Reregister).

A worker id is held by one connection at a time: a Ready that claims the id of a
live worker from another socket identity is refused until that worker is gone
(disconnected, expired or said goodbye), so no peer can evict a working worker
by naming it. With CURVE keys configured (common/auth.py) only key holders can
connect at all.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from tandem.common import protocol as p


@dataclass
class RequestIds:
    """Worker-side ids unique across router restarts: ``<epoch>.<counter in hex>``."""

    epoch: str = field(default_factory=lambda: secrets.token_hex(4))
    _n: int = 0

    def next(self) -> str:
        self._n += 1
        return f"{self.epoch}.{self._n:x}"


def foreign_frame(owner: str | None, sender: str) -> bool:
    """True when ``sender`` speaks for a request assigned to another worker (``owner``)."""
    return owner is not None and owner != sender


def takeover_problem(
    held_by: bytes | None, identity: bytes, worker_id: str, live: bool
) -> p.Problem | None:
    """Why a Ready for ``worker_id`` from ``identity`` is refused, or None.

    ``held_by``: the socket identity currently registered under that id (None:
    free); ``live``: that registration is neither expired nor disconnected.
    """
    if held_by is None or held_by == identity or not live:
        return None
    return p.Problem.bad_request(
        f"worker id {worker_id!r} is held by a live connection; a worker may take it "
        "over only after that connection is gone"
    )
