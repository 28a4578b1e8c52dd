"""/v1/models: a clean id (the model's display name), owned_by, the context length."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from openai.types import Model

from tests.gateway_fake import FakeRouter, call, gateway_app

GGUF = "SmolLM2-135M-Instruct-Q8_0.gguf"
WORKERS = [{"model": GGUF, "n_ctx": 8192}, {"model": GGUF, "n_ctx": 4096}]


def get(workers: list[dict[str, Any]], *paths: str, post: Any = None) -> list[tuple[int, Any]]:
    async def run() -> list[tuple[int, Any]]:
        app = await gateway_app(FakeRouter(workers=workers), model_aliases=("tandem",))
        out = [await call(app, "GET", path) for path in paths]
        if post is not None:
            out.append(await call(app, "POST", "/v1/chat/completions", post))
        return [(status, json.loads(raw)) for status, raw in out]

    return asyncio.run(run())


def test_models_list_the_display_name_and_aliases_with_their_context():
    ((status, body),) = get(WORKERS, "/v1/models")
    assert status == 200
    assert [m["id"] for m in body["data"]] == ["SmolLM2-135M-Instruct", "tandem"]
    for m in body["data"]:
        assert Model.model_validate(m).owned_by == "tandem"  # the official SDK reads it
        assert m["context_length"] == 8192 and m["status"] == "ready"


def test_a_model_is_found_by_its_id_its_file_name_or_an_alias():
    msgs = {"messages": [{"role": "user", "content": "hi"}]}
    paths = [f"/v1/models/{n}" for n in ("SmolLM2-135M-Instruct", GGUF, "tandem", "other")]
    *found, missing, chat = get(WORKERS, *paths, post=msgs)
    assert [(s, b["id"]) for s, b in found] == [
        (200, "SmolLM2-135M-Instruct"),
        (200, "SmolLM2-135M-Instruct"),
        (200, "tandem"),
    ]
    assert found[0][1]["context_length"] == 8192
    assert missing[0] == 404 and missing[1]["error"]["code"] == "model_not_found"
    assert chat[1]["model"] == "SmolLM2-135M-Instruct"  # answers name the clean id


def test_a_hub_model_is_owned_by_its_organisation():
    ((_, body),) = get([{"model": "Qwen/Qwen2.5-0.5B-Instruct", "n_ctx": 32768}], "/v1/models")
    qwen = body["data"][0]
    assert (qwen["id"], qwen["owned_by"]) == ("Qwen/Qwen2.5-0.5B-Instruct", "Qwen")


def test_while_starting_the_aliases_are_listed_without_a_context():
    ((status, body),) = get([], "/v1/models")
    assert status == 200
    assert [(m["id"], m["status"], m["context_length"]) for m in body["data"]] == [
        ("tandem", "starting", None)
    ]
