"""The gateway's /metrics: its own HTTP counters, latencies, open streams, bytes out."""

from __future__ import annotations

import asyncio

from prometheus_client.parser import text_string_to_metric_families

from tandem.client.session import Delta
from tests.gateway_fake import FakeRouter, call, gateway_app

CHAT = "/v1/chat/completions"
BODY = {"messages": [{"role": "user", "content": "hi"}]}


def samples(text: bytes) -> dict[tuple[str, tuple], float]:
    out = {}
    for fam in text_string_to_metric_families(text.decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_requests_are_counted_by_route_and_status_with_their_bytes():
    async def run() -> tuple[dict, list[int]]:
        app = await gateway_app(FakeRouter(deltas=[Delta([1], "a"), Delta([2], "b")]))
        statuses = []
        for path, body in [(CHAT, BODY), (CHAT, {**BODY, "stream": True}), (CHAT, b"{")]:
            status, _ = await call(app, "POST", path, body)
            statuses.append(status)
        statuses.append((await call(app, "GET", "/nowhere/x1"))[0])
        statuses.append((await call(app, "GET", "/v1/models/m.gguf"))[0])
        # A stream open while it is scraped counts as open; this one has ended.
        status, text = await call(app, "GET", "/metrics")
        assert status == 200
        return samples(text), statuses

    got, statuses = asyncio.run(run())
    assert statuses == [200, 200, 400, 404, 200]
    route = (("method", "POST"), ("route", CHAT))
    assert got[("tandem_gateway_requests_total", (*route, ("status", "200")))] == 2
    assert got[("tandem_gateway_requests_total", (*route, ("status", "400")))] == 1
    other = (("method", "GET"), ("route", "other"), ("status", "404"))
    assert got[("tandem_gateway_requests_total", other)] == 1  # no series per odd path
    model = (("method", "GET"), ("route", "/v1/models/{model}"), ("status", "200"))
    assert got[("tandem_gateway_requests_total", model)] == 1
    assert got[("tandem_gateway_request_duration_seconds_count", (("route", CHAT),))] == 3
    assert got[("tandem_gateway_response_bytes_total", (("route", CHAT),))] > 200
    assert got[("tandem_gateway_streams_open", ())] == 0
    assert got[("tandem_gateway_requests_in_flight", ())] == 1  # the scrape itself


def test_a_stream_is_open_while_it_runs():
    class Slow(FakeRouter):
        async def events(self, **options):
            async for item in super().events(**options):
                if isinstance(item, Delta):
                    await asyncio.sleep(0.2)
                yield item

    async def run() -> float:
        app = await gateway_app(Slow(deltas=[Delta([1], "a")]))
        stream = asyncio.ensure_future(call(app, "POST", CHAT, {**BODY, "stream": True}))
        await asyncio.sleep(0.1)
        _, text = await call(app, "GET", "/metrics")
        await stream
        return samples(text)[("tandem_gateway_streams_open", ())]

    assert asyncio.run(run()) == 1
