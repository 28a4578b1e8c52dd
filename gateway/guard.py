"""Slow and greedy HTTP clients: deadlines on a request's headers and body, a cap on
the connections one client address may hold, and one on all of them together (sized
from the descriptor limit: a flood from many addresses is answered 503 and closed
while the connections already open are served, instead of every accept failing).

uvicorn closes idle kept-alive connections (``timeout_keep_alive``) and can cap
concurrency as a whole (``limit_concurrency``, answered once a request is read),
but nothing bounds how long a request's headers or body take to arrive: a client
that trickles a byte now and then holds its connection, and a descriptor, for as
long as it likes (slowloris: 1,100 such connections under a 1,024-descriptor limit
and every other client was reset).

The guard lives in the HTTP protocol, as a subclass of uvicorn's httptools protocol:

- an ASGI middleware sees a request only once its headers are complete, so it
  cannot time them, and it never sees connections at all;
- a byte-level asyncio layer in front of the protocol would have to parse HTTP
  again (chunked bodies, pipelined requests) to know where headers and a body
  end, which the parser already knows.

The subclass overrides only asyncio's ``Protocol`` methods and httptools' parser
callbacks (``on_message_begin``, ``on_headers_complete``, ``on_message_complete``,
the names httptools calls), each after uvicorn's own.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from tandem.common.refusals import RefusalLog
from tandem.gateway.errors import ApiError

log = logging.getLogger(__name__)
# Why a connection was refused or cut off: over a cap (503 / 429), or too slow for the
# headers or body deadline (``_expire``: ``slow_`` and what). /metrics reports each.
REFUSAL_REASONS = ("over_total", "over_per_client", "slow_headers", "slow_body")


@dataclass
class ConnectionLimits:
    """The guard's settings, and the connections it counts per client address."""

    header_timeout_s: float
    body_timeout_s: float
    max_per_client: int
    max_total: int | None = None  # from every address together; None: no cap
    open: Counter[str] = field(default_factory=Counter)
    total: int = 0
    # Connections refused or cut off, by reason (REFUSAL_REASONS): counted for
    # /metrics, logged at a bounded rate.
    refusals: RefusalLog = field(default_factory=lambda: RefusalLog(log))

    def refusal(self, address: str | None) -> bytes | None:
        """The whole answer to a connection over a cap (then closed), or None: admitted.
        Over the total, 503 (the server is full, retry); over one address's share, 429."""
        if self.max_total is not None and self.total >= self.max_total:
            self.refusals.refused(
                "over_total", "gateway: refused a connection: %d open, the cap", self.total
            )
            return _answer(
                ApiError(
                    503,
                    f"the gateway holds {self.max_total} connections, its cap; retry shortly",
                    "service_unavailable",
                    code="too_many_connections",
                ),
                "503 Service Unavailable",
            )
        if address is not None and self.open[address] >= self.max_per_client:
            self.refusals.refused(
                "over_per_client", "gateway: refused a connection from %s (over its cap)", address
            )
            return _answer(
                ApiError(
                    429,
                    f"more than {self.max_per_client} connections from your address; "
                    "close some, or reuse them",
                    "rate_limit_error",
                    code="too_many_connections",
                ),
                "429 Too Many Requests",
            )
        return None


def _answer(err: ApiError, status_line: str) -> bytes:
    body = json.dumps(err.body()).encode()
    head = (
        f"HTTP/1.1 {status_line}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


def guarded_protocol(limits: ConnectionLimits) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol with ``limits`` applied (uvicorn's ``http=``)."""

    class GuardedHttpProtocol(HttpToolsProtocol):
        # A stream protocol is handed a Transport; asyncio's stubs type the base's argument
        # as BaseTransport, and uvicorn's own override carries the same ignore.
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._deadline: asyncio.TimerHandle | None = None
            peer: Any = transport.get_extra_info("peername")
            address = peer[0] if isinstance(peer, tuple) and peer else None  # none on unix sockets
            self._counted: str | None = None
            self._in_total = False
            refusal = limits.refusal(address)
            if refusal is not None:
                transport.write(refusal)
                transport.close()
                return
            limits.total += 1
            self._in_total = True
            if address is not None:
                limits.open[address] += 1
                self._counted = address
            # A fresh connection owes its first request's headers from now on.
            self._arm(limits.header_timeout_s, "headers")

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            if self._in_total:
                limits.total -= 1
                self._in_total = False
            if self._counted is not None:
                limits.open[self._counted] -= 1
                if not limits.open[self._counted]:
                    del limits.open[self._counted]
                self._counted = None
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            if self._deadline is None:  # a later request on a kept-alive connection
                self._arm(limits.header_timeout_s, "headers")

        def on_headers_complete(self) -> None:
            super().on_headers_complete()
            self._arm(limits.body_timeout_s, "body")

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._disarm()  # the request is in; its answer may take as long as it takes

        def _arm(self, seconds: float, what: str) -> None:
            self._disarm()
            self._deadline = asyncio.get_running_loop().call_later(seconds, self._expire, what)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expire(self, what: str) -> None:
            self._deadline = None
            limits.refusals.refused(
                f"slow_{what}", "gateway: closed a connection whose request %s took too long", what
            )
            # The app, if it was reading the body, sees the client gone (no answer).
            self.transport.close()

    return GuardedHttpProtocol
