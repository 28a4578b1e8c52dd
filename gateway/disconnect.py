"""Noticing that an HTTP client went away, so its request is cancelled on the worker.

The router keeps generating for a client until told otherwise, and a worker slot is
the scarcest thing in the cluster: both helpers here stop the awaiting code as soon
as the ASGI server reports ``http.disconnect``, and the cancellation reaches
``AsyncClient`` (whose cleanup sends ``cancel``) at once rather than at the next
token write.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

log = logging.getLogger(__name__)
T = TypeVar("T")


class ClientGone(Exception):
    """The HTTP client disconnected before its answer was ready."""


async def _disconnected(receive: Receive) -> None:
    # After the body is read, the server's receive() returns only on disconnect (or
    # once the response is complete).
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, aw: Awaitable[T]) -> T:
    """The result of ``aw``; raises ClientGone (having cancelled ``aw``) when the client
    disconnects first."""
    task = asyncio.ensure_future(aw)
    watch = asyncio.ensure_future(_disconnected(request.receive))
    try:
        done, _ = await asyncio.wait((task, watch), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # this handler itself was cancelled
        task.cancel()
        raise
    finally:
        watch.cancel()
    if task in done:
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    raise ClientGone


class EventStream(StreamingResponse):
    """A server-sent-event response that stops its body as soon as the client leaves,
    and always closes the body generator and calls ``on_close`` before returning."""

    media_type = "text/event-stream"

    def __init__(self, *args: Any, on_close: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        streamer = asyncio.ensure_future(self.stream_response(send))
        watcher = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait((streamer, watcher), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (streamer, watcher):
                task.cancel()
            outcome = await asyncio.gather(streamer, watcher, return_exceptions=True)
            aclose = getattr(self.body_iterator, "aclose", None)
            try:
                if aclose is not None:
                    await aclose()
            finally:
                self.on_close()
        failed = outcome[0]
        # OSError: the client closed the connection while we wrote to it.
        if isinstance(failed, Exception) and not isinstance(failed, OSError):
            log.error("event stream failed", exc_info=failed)
