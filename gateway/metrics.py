"""The gateway's own HTTP metrics, served as ``GET /metrics`` on its port.

A pure ASGI middleware (Starlette's BaseHTTPMiddleware would buffer a stream's body
through a task per response): it reads the status from the response's start, counts
the bytes of each body piece in a local and touches the shared metrics once per
response, so a stream's per-token cost is one extra function call. The router's own
metrics (routing, workers, tokens) are on the router's --metrics-port;
docs/METRICS.md lists both.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from starlette.requests import Request
from starlette.responses import Response

from tandem.gateway.guard import REFUSAL_REASONS, ConnectionLimits

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

# The route label: a path's template, so that a scan of odd paths adds no series.
ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics")
OTHER_ROUTE = "other"
# Seconds. Generations run from milliseconds (a refusal) to minutes (a long stream).
LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


def route_of(path: str) -> str:
    if path in ROUTES:
        return path
    if path.startswith("/v1/models/"):
        return "/v1/models/{model}"
    return OTHER_ROUTE


class HttpMetrics:
    """The gateway's metrics in a registry of their own (one per app: tests build many)."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter(
            "tandem_gateway_requests",
            "HTTP requests answered, by route, method and status (499: the client left).",
            ["route", "method", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "tandem_gateway_request_duration_seconds",
            "Request received to the response's last byte sent (a stream's whole length).",
            ["route"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.first_byte = Histogram(
            "tandem_gateway_response_start_seconds",
            "Request received to the response's status and headers sent.",
            ["route"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.bytes_out = Counter(
            "tandem_gateway_response_bytes",
            "Response body bytes sent, by route.",
            ["route"],
            registry=r,
        )
        self.in_flight = Gauge(
            "tandem_gateway_requests_in_flight", "HTTP requests being answered.", registry=r
        )
        self.streams = Gauge(
            "tandem_gateway_streams_open", "Server-sent-event streams open.", registry=r
        )

    def watch(self, limits: ConnectionLimits) -> None:
        """Also report ``limits`` (gateway/guard.py ``ConnectionLimits``): read when
        scraped, so a connection costs the guard's own counting and nothing more."""
        self.registry.register(_ConnectionCollector(limits))

    async def endpoint(self, request: Request) -> Response:
        """``GET /metrics``: the Prometheus text format."""
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)


class _ConnectionCollector:
    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits

    def describe(self) -> list[Any]:
        return []  # registered unchecked: the families are built when scraped

    def collect(self) -> Any:
        lim = self.limits
        yield GaugeMetricFamily(
            "tandem_gateway_connections_open", "HTTP connections open.", value=lim.total
        )
        if lim.max_total is not None:
            yield GaugeMetricFamily(
                "tandem_gateway_connections_max", "The cap on open connections.",
                value=lim.max_total,
            )  # fmt: skip
        refused = CounterMetricFamily(
            "tandem_gateway_connections_refused",
            "Connections answered and closed over a cap (over_total: 503, over_per_client: "
            "429) or closed for a request too slow (slow_headers, slow_body).",
            labels=["reason"],
        )
        for reason in REFUSAL_REASONS:
            refused.add_metric([reason], lim.refusals.counts[reason])
        yield refused


class MetricsMiddleware:
    """Counts every HTTP exchange of the app it wraps into an ``HttpMetrics``."""

    def __init__(self, app: App, metrics: HttpMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        m, route, t0 = self.metrics, route_of(scope["path"]), time.perf_counter()
        status, sent, stream = 500, 0, False  # an exception before the start is a 500

        def counted(message: Message) -> Awaitable[None]:
            # Not a coroutine: it returns send's own awaitable, so a streamed token
            # costs one plain call here, not one more coroutine frame.
            nonlocal status, sent, stream
            if message["type"] == "http.response.body":
                sent += len(message.get("body", b""))
            elif message["type"] == "http.response.start":
                status = message["status"]
                m.first_byte.labels(route).observe(time.perf_counter() - t0)
                stream = any(
                    k == b"content-type" and v.startswith(b"text/event-stream")
                    for k, v in message.get("headers", ())
                )
                if stream:
                    m.streams.inc()
            return send(message)

        m.in_flight.inc()
        try:
            await self.app(scope, receive, counted)
        finally:
            m.in_flight.dec()
            if stream:
                m.streams.dec()
            m.requests.labels(route, scope["method"], str(status)).inc()
            m.latency.labels(route).observe(time.perf_counter() - t0)
            if sent:
                m.bytes_out.labels(route).inc(sent)
