"""tandem's client library: ``Client`` (blocking) and ``AsyncClient`` (asyncio)."""

from tandem.client.aio import AsyncClient
from tandem.client.errors import (
    BadRequest,
    HandshakeRefused,
    NoWorkers,
    Overloaded,
    PromptTooLong,
    RequestTimeout,
    RouterLost,
    RouterUnavailable,
    TandemError,
    VersionMismatch,
    WorkerLost,
)
from tandem.client.session import Delta, Result
from tandem.client.sync import Client

__all__ = [
    "AsyncClient",
    "BadRequest",
    "Client",
    "Delta",
    "HandshakeRefused",
    "NoWorkers",
    "Overloaded",
    "PromptTooLong",
    "RequestTimeout",
    "Result",
    "RouterLost",
    "RouterUnavailable",
    "TandemError",
    "VersionMismatch",
    "WorkerLost",
]
