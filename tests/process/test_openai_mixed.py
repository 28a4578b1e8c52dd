"""Issue 31 on a mixed cluster: a llama.cpp worker on a shaped Qwen2 GGUF and an MLX
worker on the folder converted from it, behind the gateway, driven by the openai SDK.
The router sends each request to a worker that can serve it: a JSON schema to a worker
with a grammar engine (llama.cpp's grammar; MLX's llguidance where it is installed,
else llama.cpp only), logprobs and penalties to either."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tandem.launcher.cluster import Cluster, WorkerSpec
from tests.helpers import LLAMA_ARGS, needs_llama
from tests.process.test_families_cluster import MLX_ARGS
from tests.process.test_families_cluster import qwen2 as qwen2  # the fixture, re-exported

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")
pytestmark = [pytest.mark.model, pytest.mark.mlx, needs_llama]

# Short by construction: a random-weights model fills strings without end. (Not
# "minimum" / "maximum": llama-cpp-python's converter leaves integer bounds out of the
# grammar, and a random model then writes -9999999999999999.)
SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "n": {"enum": [0, 1, 2, 3]}},
    "required": ["ok", "n"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Answer in JSON."}]


def worker_of(response: object) -> str:
    return response.model_extra["tandem"]["worker"]  # type: ignore[attr-defined]


def test_each_request_goes_to_a_worker_that_can_serve_it(qwen2: tuple[Path, Path]) -> None:
    gguf, folder = qwen2
    workers = [
        WorkerSpec("cpu0", [*LLAMA_ARGS, "--model", str(gguf)]),
        WorkerSpec("mlx0", [*MLX_ARGS, "--model", str(folder)]),
    ]
    with Cluster(workers=workers, start_timeout_s=180) as cl:
        client = openai.OpenAI(
            base_url=f"{cl.start_gateway()}/v1", api_key="x", max_retries=0, timeout=180.0
        )
        with cl.client() as c:
            caps = {w["id"]: set(w["capabilities"]) for w in c.status().workers}
        mlx_grammar = importlib.util.find_spec("llguidance") is not None
        assert "json_schema" in caps["cpu0"]
        assert ("json_schema" in caps["mlx0"]) == mlx_grammar
        assert {"penalties", "logprobs"} <= caps["mlx0"]
        model = client.models.list().data[0].id
        fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}
        for seed in range(3):  # the cost model chooses among the capable workers
            r = client.chat.completions.create(
                model=model, messages=ASK, max_tokens=64, seed=seed, response_format=fmt
            )
            assert mlx_grammar or worker_of(r) == "cpu0"
            jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)
        for w in ("cpu0", "mlx0"):  # both serve logprobs and penalties
            r = client.chat.completions.create(
                model=model, messages=ASK, max_tokens=4, temperature=0, logprobs=True,
                top_logprobs=2, presence_penalty=1.0, extra_body={"worker": w, "ignore_eos": True},
            )  # fmt: skip
            assert worker_of(r) == w and len(r.choices[0].logprobs.content) == 4
        # A bound llama.cpp's grammar leaves out needs json_schema_full: MLX's, or a 400.
        bounded = {
            **SCHEMA,
            "properties": {
                **SCHEMA["properties"],
                "k": {"type": "integer", "minimum": 0, "maximum": 9},
            },
        }
        bfmt = {"type": "json_schema", "json_schema": {"name": "b", "schema": bounded}}
        if mlx_grammar:
            r = client.chat.completions.create(
                model=model, messages=ASK, max_tokens=64, response_format=bfmt
            )
            assert worker_of(r) == "mlx0"
            jsonschema.validate(json.loads(r.choices[0].message.content), bounded)
        else:
            with pytest.raises(openai.BadRequestError, match="json_schema_full"):
                client.chat.completions.create(
                    model=model, messages=ASK, max_tokens=64, response_format=bfmt
                )
        pinned = {"model": model, "messages": ASK, "max_tokens": 64, "response_format": fmt}
        if mlx_grammar:  # MLX constrains the output too
            r = client.chat.completions.create(**pinned, extra_body={"worker": "mlx0"})
            assert worker_of(r) == "mlx0"
            jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)
        else:
            with pytest.raises(openai.BadRequestError, match="json_schema"):
                client.chat.completions.create(**pinned, extra_body={"worker": "mlx0"})
