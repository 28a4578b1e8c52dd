"""What the gateway's /metrics middleware and logprobs cost per streamed token, in process.

The real gateway app is driven through ASGI with a fake router that streams N deltas
at once (no sockets, no model): the time per delta is the gateway's own Python work.
Three apps side by side, runs interleaved: the middleware taken out, as served, and
as served with logprobs asked for (top 5). Prints microseconds per streamed delta.

    PYTHONPATH=. .venv/bin/python tests/gateway_middleware_cost.py [--deltas 4000] [--runs 7]

A script beside the tests (it drives their fake router), not a test: pytest collects
only test_*.py.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from tandem.client.session import Delta, Result
from tandem.common import protocol as p
from tests.gateway_fake import FakeRouter, call, gateway_app

TOP = [(i, f"t{i}", -float(i)) for i in range(5)]


def router(n: int, logprobs: bool) -> FakeRouter:
    lp = [p.TokenLogprob(7, " tok", -0.5, TOP)] if logprobs else None
    deltas = [Delta([7], " tok", lp) for _ in range(n)]
    result = Result("r", "", [7] * n, p.FinishReason.LENGTH, {"output_tokens": n}, "w0")
    return FakeRouter(deltas=deltas, result=result)


async def app_of(kind: str, n: int) -> Any:
    app = await gateway_app(router(n, kind == "logprobs"))
    if kind == "bare":  # the Starlette app without the metrics middleware
        app.user_middleware = [m for m in app.user_middleware if "Metrics" not in str(m.cls)]
        app.middleware_stack = None
    return app


async def per_delta_us(app: Any, n: int, logprobs: bool) -> float:
    body: dict[str, Any] = {"prompt": "x", "max_tokens": n, "stream": True}
    if logprobs:
        body["logprobs"] = 5
    t0 = time.perf_counter()
    status, _ = await call(app, "POST", "/v1/completions", body)
    assert status == 200
    return (time.perf_counter() - t0) / n * 1e6


async def main(n: int, runs: int) -> None:
    kinds = ("bare", "served", "logprobs")
    apps = {k: await app_of(k, n) for k in kinds}
    times: dict[str, list[float]] = {k: [] for k in kinds}
    for _ in range(runs):
        for k in kinds:
            times[k].append(await per_delta_us(apps[k], n, k == "logprobs"))
    base = statistics.median(times["bare"])
    for k in kinds:
        med = statistics.median(times[k])
        print(f"{k:9s} {med:7.2f} us/delta  x{med / base:.3f}  (runs: {len(times[k])})")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--deltas", type=int, default=4000)
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    asyncio.run(main(args.deltas, args.runs))
