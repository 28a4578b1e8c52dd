"""The real gateway app driven through ASGI, with a fake router behind it.

``FakeRouter`` is both of the gateway's router clients: a status listing workers,
and generations whose Submit must encode and decode with the real protocol (as the
client library's would); it answers with the Deltas and Result a test gives it and
keeps every Submit it was sent."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from tandem.client.session import Delta, Result, make_submit
from tandem.common import protocol as p
from tandem.gateway.app import build_app
from tandem.gateway.config import GatewayConfig


class FakeRouter:
    def __init__(
        self,
        workers: list[dict[str, Any]] | None = None,
        deltas: list[Delta] | None = None,
        result: Result | None = None,
    ) -> None:
        self.workers = [{"model": "m.gguf", "n_ctx": 4096}] if workers is None else workers
        self.deltas = deltas or []
        self.result = result
        self.submits: list[p.Submit] = []

    async def status(self) -> p.StatusReply:
        return p.StatusReply("phase_cost", self.workers)

    def _submit(self, prompt: str | None, options: dict[str, Any]) -> p.Submit:
        """As the client library takes its arguments: a prompt and fields, or a
        ``submit=`` alone."""
        sub = options.pop("submit", None)
        if sub is None:
            sub = make_submit(prompt, **options)
        else:
            assert prompt is None and not options
        got = p.decode(p.encode(sub))  # what the router would read
        assert isinstance(got, p.Submit)
        self.submits.append(got)
        return got

    def _result(self, sub: p.Submit) -> Result:
        if self.result is not None:
            return self.result
        return Result(sub.request_id, "ok", [1], p.FinishReason.LENGTH, {"prompt_tokens": 1})

    async def generate(self, prompt: str | None = None, **options: Any) -> Result:
        return self._result(self._submit(prompt, options))

    async def events(self, prompt: str | None = None, **options: Any) -> AsyncIterator[Any]:
        sub = self._submit(prompt, options)
        yield p.Accepted(sub.request_id, "w0", 1)
        for d in self.deltas:
            yield d
        yield self._result(sub)

    def cancel(self, request_id: str) -> None:
        pass

    async def close(self) -> None:
        pass


async def gateway_app(router: FakeRouter | None = None, **cfg: Any) -> Any:
    """The gateway's Starlette app, its router clients replaced by ``router``."""
    app = build_app(GatewayConfig("tcp://127.0.0.1:1", **cfg))
    gw = app.state.gateway
    await gw.start()
    await gw.stop()  # its real clients: replaced by the fake
    gw.client = gw.status_client = router or FakeRouter()
    return app


async def call(app: Any, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
    """One HTTP exchange through ASGI: (status, whole body). ``body``: JSON-able,
    or bytes sent as they are."""
    raw = body if isinstance(body, bytes) else b"" if body is None else json.dumps(body).encode()
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8000),
        "headers": [(b"content-type", b"application/json"),
                    (b"content-length", str(len(raw)).encode())],
    }  # fmt: skip
    incoming = [{"type": "http.request", "body": raw, "more_body": False}]
    sent: list[dict] = []

    async def receive() -> dict:
        if incoming:
            return incoming.pop()
        await asyncio.sleep(3600)  # the client never leaves
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])


def sse_events(raw: bytes) -> list[Any]:
    """The JSON objects of a server-sent-event body, up to ``[DONE]``."""
    out = []
    for event in raw.split(b"\n\n"):
        if event.startswith(b"data: ") and event != b"data: [DONE]":
            out.append(json.loads(event[6:]))
    return out
