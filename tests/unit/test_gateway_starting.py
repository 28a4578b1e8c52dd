"""The gateway while workers start: /health and /v1/models say "starting", naming the
workers that announced themselves (``StatusReply.starting``) and their model."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from tandem.common import protocol as p
from tests.gateway_fake import FakeRouter, call, gateway_app

ROW = {"id": "cpu0", "state": "starting", "device": "cpu", "model": "SmolLM2-135M-Instruct",
       "stage": "measuring", "eta_s": 3.6, "starting_for_s": 1.0, "last_seen_s": 0.2}  # fmt: skip


class StartingRouter(FakeRouter):
    def __init__(self, starting: list[dict[str, Any]]) -> None:
        super().__init__(workers=[])
        self.starting = starting

    async def status(self) -> p.StatusReply:
        return p.StatusReply("lookahead", [], starting=self.starting)


def get(starting: list[dict[str, Any]], *paths: str, **cfg: Any) -> list[tuple[int, Any]]:
    async def run() -> list[tuple[int, Any]]:
        app = await gateway_app(StartingRouter(starting), **cfg)
        return [await call(app, "GET", path) for path in paths]

    return [(status, json.loads(raw)) for status, raw in asyncio.run(run())]


def test_health_names_the_starting_worker_its_stage_and_time_left():
    ((status, body),) = get([ROW], "/health")
    assert status == 503 and body["status"] == "starting" and body["workers"] == 0
    assert body["reason"] == "waiting for worker cpu0 (measuring itself, ~4 s)"
    assert [w["id"] for w in body["starting"]] == ["cpu0"]
    ((status, body),) = get([], "/health")  # nobody announced: no names to give
    assert status == 503 and body["starting"] == [] and "no worker" in body["reason"]


def test_models_list_the_starting_worker_s_model_beside_the_aliases():
    ((status, body),) = get([ROW], "/v1/models", model_aliases=("smol",))
    assert status == 200
    listed = [(m["id"], m["status"]) for m in body["data"]]
    assert listed == [("SmolLM2-135M-Instruct", "starting"), ("smol", "starting")]
