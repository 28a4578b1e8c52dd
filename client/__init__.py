"""tandem's client library: ``Client`` (blocking) and ``AsyncClient`` (asyncio)."""

from client.aio import AsyncClient
from client.errors import (
    BadRequest,
    NoWorkers,
    Overloaded,
    PromptTooLong,
    RequestTimeout,
    TandemError,
    VersionMismatch,
    WorkerLost,
)
from client.session import Delta, Result
from client.sync import Client

__all__ = [
    "AsyncClient",
    "BadRequest",
    "Client",
    "Delta",
    "NoWorkers",
    "Overloaded",
    "PromptTooLong",
    "RequestTimeout",
    "Result",
    "TandemError",
    "VersionMismatch",
    "WorkerLost",
]
