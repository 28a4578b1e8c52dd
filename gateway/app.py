"""The gateway's HTTP API: OpenAI's chat and text completions, models, health.

A client of the router like any other (one ``AsyncClient``, one DEALER socket, every
request multiplexed over it): no routing state lives here, so several gateways can
front one router. The router's status, cached for ``status_ttl_s``, answers which
model is served and whether any worker is there. While none is (workers starting),
/health and /v1/models say "starting" and generation requests go through: the
router holds them until a first worker registers.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tandem.client.aio import AsyncClient
from tandem.client.errors import RouterLost, TandemError
from tandem.client.session import Delta, Result
from tandem.client.waiting import waiting_for_starting
from tandem.common import protocol as p
from tandem.gateway.bodies import Parsers, count_messages
from tandem.gateway.config import GatewayConfig
from tandem.gateway.disconnect import ClientGone, EventStream, unless_disconnected
from tandem.gateway.errors import EXCEPTION_HANDLERS, ApiError
from tandem.gateway.guard import ConnectionLimits
from tandem.gateway.metrics import HttpMetrics, MetricsMiddleware
from tandem.gateway.models import STARTING, display_name, model_list, model_object, served_as
from tandem.gateway.parse import Generation, read_request
from tandem.gateway.render import DONE_EVENT, Reply, sse

log = logging.getLogger(__name__)
STATUS_TIMEOUT_S = 3.0  # a router that does not answer status this fast is down for us
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class Gateway:
    """State shared by all requests: the router connection, its cached status, the
    count of requests in flight."""

    def __init__(self, cfg: GatewayConfig) -> None:
        self.cfg = cfg
        self.client: AsyncClient | None = None
        self.status_client: AsyncClient | None = None
        self.inflight = 0
        self._status: p.StatusReply | None = None
        self._status_at = 0.0
        self._status_lock: asyncio.Lock | None = None
        self._refresh: asyncio.Future[None] | None = None
        self._failed: tuple[float, ApiError] | None = None  # the last failed query
        self.parsers = Parsers()

    async def start(self) -> None:
        cfg = self.cfg
        self.client = AsyncClient(cfg.router, timeout_s=cfg.request_timeout_s, keys=cfg.keys)
        # Its own socket with a short timeout: a slow status must not look like a
        # generation timeout, and a dead router must answer 503 quickly.
        self.status_client = AsyncClient(cfg.router, timeout_s=STATUS_TIMEOUT_S, keys=cfg.keys)
        self._status_lock = asyncio.Lock()

    async def stop(self) -> None:
        for c in (self.client, self.status_client):
            if c is not None:
                await c.close()

    # ------------------------------------------------------------ router status
    async def status(self, fresh: bool = False) -> p.StatusReply:
        """The router's status, at most ``status_ttl_s`` old; ``fresh``: asked after this
        call began. Callers queued behind one query share its answer (or its failure),
        so a router that does not answer costs a burst one timeout, not one each."""
        assert self.status_client is not None and self._status_lock is not None
        asked = time.monotonic()
        async with self._status_lock:
            if self._failed is not None and self._failed[0] >= asked:
                raise self._failed[1]
            oldest_ok = asked if fresh else time.monotonic() - self.cfg.status_ttl_s
            if self._status is None or self._status_at < oldest_ok:
                try:
                    self._status = await self.status_client.status()
                except RouterLost as exc:  # no router there, or it refuses our keys
                    err = ApiError.from_tandem(exc)
                    self._failed = (time.monotonic(), err)
                    raise err from None
                except TandemError as exc:
                    err = ApiError(503, f"the router does not answer: {exc}", "service_unavailable")
                    self._failed = (time.monotonic(), err)
                    raise err from None
                self._status_at = time.monotonic()
            return self._status

    async def served_model(self, asked: str | None) -> str:
        """The model name to answer with; 404 for another model.

        A cached status that lists workers answers at once (refreshed in the
        background once stale), so requests do not wait on a status round trip;
        one that lists none is asked again first (a worker may have joined). With
        no worker yet the request goes on to the router, which holds it until one
        registers (503 no_workers if none does in its --no-worker-wait-s): its model
        name cannot be checked before a worker says which model it serves."""
        st = self._status
        if st is None or not st.workers:
            st = await self.status(fresh=True)
        elif time.monotonic() - self._status_at > self.cfg.status_ttl_s:
            self._refresh_in_background()
        if not st.workers:
            return asked or next(iter(self.cfg.model_aliases), "tandem")
        model = display_name(str(st.workers[0]["model"]))
        if asked is None or asked in self.cfg.model_aliases:
            return asked or model
        served = served_as(st.workers, asked)
        if served is not None:
            return served
        raise ApiError(
            404,
            f"the model {asked!r} does not exist; this server has {model!r}",
            param="model",
            code="model_not_found",
        )

    def _refresh_in_background(self) -> None:
        if self._refresh is None or self._refresh.done():
            self._refresh = asyncio.ensure_future(self._quiet_refresh())

    async def _quiet_refresh(self) -> None:
        try:
            await self.status(fresh=True)
        except ApiError as exc:  # the next request that needs it will see the failure
            log.warning("router status: %s", exc.message)

    # ------------------------------------------------------------ admission
    def admit(self) -> None:
        if self.inflight >= self.cfg.max_concurrent:
            raise ApiError(
                429,
                f"{self.inflight} requests in flight through this gateway; retry later",
                "rate_limit_error",
                code="overloaded",
            )
        self.inflight += 1

    def release(self) -> None:
        self.inflight -= 1

    def authorize(self, request: Request) -> None:
        key = self.cfg.api_key
        if key is None:
            return
        given = request.headers.get("authorization", "")
        token = given[7:] if given[:7].lower() == "bearer " else ""
        if not hmac.compare_digest(token.encode(), key.encode()):
            raise ApiError(401, "missing or incorrect API key", code="invalid_api_key")

    async def body(self, request: Request) -> bytes:
        """The raw body, at most ``max_body_bytes`` (413 beyond); ClientGone when the
        client leaves (or is closed for being too slow) before it is all in."""
        limit = self.cfg.max_body_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise ApiError(413, f"request body over {limit} bytes", code="body_too_large")
        raw = bytearray()
        try:
            async for piece in request.stream():
                raw += piece
                if len(raw) > limit:
                    raise ApiError(413, f"request body over {limit} bytes", code="body_too_large")
        except ClientDisconnect:
            raise ClientGone from None
        return bytes(raw)

    # ------------------------------------------------------------ generation
    async def generate(self, request: Request, chat: bool) -> Response:
        self.authorize(request)
        try:
            raw = await self.body(request)
        except ClientGone:
            return Response(status_code=499)
        gen = await self._read(raw, chat)
        reply = Reply(chat, gen.request_id, await self.served_model(gen.model))
        self.admit()
        try:
            if gen.stream:
                return await self._stream(request, gen, reply)
            result = await unless_disconnected(request, self._complete(gen))
            return JSONResponse(reply.complete(result))
        except ClientGone:
            return Response(status_code=499)  # nobody reads it; nginx's "client closed"
        except TandemError as exc:
            raise ApiError.from_tandem(exc) from None
        finally:
            if not gen.stream:
                self.release()

    async def _read(self, raw: bytes, chat: bool) -> Generation:
        """The body priced (its messages counted from its bytes), then parsed: on a
        thread, a few at a time, when it is large (gateway/bodies.py)."""
        cfg = self.cfg
        if chat:
            count_messages(raw, cfg.max_messages)
        rid = uuid.uuid4().hex
        read = partial(read_request, chat=chat, default_max_tokens=cfg.default_max_tokens,
                       request_id=rid, max_messages=cfg.max_messages)  # fmt: skip
        return await self.parsers.parse(read, raw)

    async def _complete(self, gen: Generation) -> Result:
        assert self.client is not None
        return await self.client.generate(submit=gen.submit)

    async def _stream(self, request: Request, gen: Generation, reply: Reply) -> Response:
        """Wait until the router accepts the request (every refusal before that still
        gets its HTTP status), then stream: the first token then goes from the router's
        socket to the HTTP connection inside the streaming task, without waking this
        handler in between (TTFT)."""
        client = self.client
        assert client is not None
        events = client.events(submit=gen.submit)
        try:
            first = await unless_disconnected(request, anext(events))
        except BaseException:
            self.release()
            raise
        ended: list[bool] = []  # filled once the request is over at the router

        def close() -> None:  # runs however the response ends, even if never started
            self.release()
            if not ended:  # the client left (or the stream broke): free the worker
                client.cancel(reply.request_id)

        body = self._events(events, first, gen, reply, ended)
        return EventStream(body, headers=SSE_HEADERS, on_close=close)

    async def _events(
        self,
        events: AsyncIterator[p.Accepted | Delta | Result],
        item: p.Accepted | Delta | Result,
        gen: Generation,
        reply: Reply,
        ended: list[bool],
    ) -> AsyncIterator[bytes]:
        try:
            role = reply.chat  # the first chat chunk carries the assistant role
            while not isinstance(item, Result):
                if isinstance(item, p.Accepted):  # nothing to show yet
                    pass
                elif role:
                    yield reply.chunk(item.text, role=True, logprobs=item.logprobs)
                    role = False
                elif item.logprobs is not None:  # even with no text yet: none is lost
                    yield reply.chunk(item.text, logprobs=item.logprobs)
                elif item.text:
                    yield reply.text_chunk(item.text)
                item = await anext(events)
            ended.append(True)
            # The closing events in one write: the client sees the end at once.
            tail = reply.chunk(None, item.finish_reason)
            if gen.include_usage:
                tail += reply.usage_chunk(item)
        except TandemError as exc:  # after a 200 went out, errors travel as an event
            ended.append(True)
            tail = sse(ApiError.from_tandem(exc).body())
        yield tail + DONE_EVENT

    # ------------------------------------------------------------ other endpoints
    async def models(self, request: Request) -> Response:
        self.authorize(request)
        st = await self.status()  # starting: the names it was told to serve under, if any
        aliases = self.cfg.model_aliases
        if not st.workers:  # and those of the workers that announced they are starting
            aliases = (*aliases, *(str(s["model"]) for s in st.starting))
        data = model_list(st.workers, aliases)
        return JSONResponse({"object": "list", "data": data})

    async def model(self, request: Request) -> Response:
        """``GET /v1/models/{id}``: the model, or 404."""
        self.authorize(request)
        name = await self.served_model(request.path_params["model"])
        listed = {m["id"]: m for m in model_list(self._status_workers(), self.cfg.model_aliases)}
        return JSONResponse(listed.get(name) or model_object(name, None, STARTING))

    def _status_workers(self) -> list[dict[str, Any]]:
        return self._status.workers if self._status is not None else []

    async def health(self, request: Request) -> Response:
        try:
            st = await self.status()
        except ApiError as exc:
            return JSONResponse({"status": "unavailable", "reason": exc.message}, 503)
        if st.workers:
            return JSONResponse({"status": "ok", "workers": len(st.workers)})
        why = "no worker has registered yet (one registers once its model is loaded)"
        if st.starting:
            why = waiting_for_starting(st.starting)
        body = {"status": STARTING, "workers": 0, "starting": st.starting, "reason": why}
        return JSONResponse(body, 503)


def build_app(cfg: GatewayConfig, limits: ConnectionLimits | None = None) -> Starlette:
    """The ASGI application (served by ``tandem gateway`` through uvicorn); ``limits``:
    the connection guard's, reported at /metrics."""
    gw = Gateway(cfg)
    metrics = HttpMetrics()
    if limits is not None:
        metrics.watch(limits)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await gw.start()
        log.info("gateway: router %s", cfg.router)
        try:
            yield
        finally:
            await gw.stop()

    async def chat(request: Request) -> Response:
        return await gw.generate(request, chat=True)

    async def completions(request: Request) -> Response:
        return await gw.generate(request, chat=False)

    routes = [
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/models", gw.models, methods=["GET"]),
        Route("/v1/models/{model:path}", gw.model, methods=["GET"]),
        Route("/health", gw.health, methods=["GET"]),
        Route("/metrics", metrics.endpoint, methods=["GET"]),  # no key, as /health
    ]
    app = Starlette(
        routes=routes,
        exception_handlers=EXCEPTION_HANDLERS,
        lifespan=lifespan,
        middleware=[Middleware(MetricsMiddleware, metrics=metrics)],
    )
    app.state.gateway = gw
    app.state.metrics = metrics
    return app
