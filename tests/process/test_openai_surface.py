"""The OpenAI surface users rely on (issue 31), end to end through real processes:
the official SDK against a gateway + router + a worker.

- a llama.cpp worker on the embedded model: penalties, response_format with a JSON
  schema (the output parses and validates), logprobs (whole and streamed) — each gets
  what it asked for;
- a sim worker, which advertises no capability: a request that needs one is a 400
  naming it, at once.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from tandem.launcher.cluster import Cluster, WorkerSpec
from tandem.workers.device_model import BUNDLED_PROFILES
from tests.helpers import LLAMA_ARGS, needs_llama

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer"},  # (no "minimum": a llama.cpp worker refuses it)
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Invent a person. Answer with their name and age."}]


def sdk(url: str) -> openai.OpenAI:
    # No retries: a 4xx or 5xx must reach the test as it was answered.
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120.0)


def served(workers: list[WorkerSpec], log_dir: Path) -> Iterator[tuple[Cluster, str]]:
    with Cluster(workers, log_dir=log_dir) as c:
        yield c, c.start_gateway()


@pytest.fixture(scope="module")
def llama_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, str]]:
    if needs_llama.args[0]:  # skipif's condition: llama-cpp-python is missing
        pytest.skip(needs_llama.kwargs["reason"])
    yield from served([WorkerSpec("cpu0", LLAMA_ARGS)], tmp_path_factory.mktemp("llama"))


@pytest.fixture(scope="module")
def llama(llama_cluster: tuple[Cluster, str]) -> str:
    return llama_cluster[1]


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    args = ["--backend", "sim", "--profile", str(BUNDLED_PROFILES / "cpu-m2.json")]
    for _, url in served([WorkerSpec("sim0", args)], tmp_path_factory.mktemp("sim")):
        yield url


# ------------------------------------------------------------ a worker that has them
@pytest.mark.model
def test_a_schema_constrains_the_output(llama: str) -> None:
    client = sdk(llama)
    model = client.models.list().data[0].id
    r = client.chat.completions.create(
        model=model,
        messages=ASK,
        max_tokens=128,
        temperature=0.8,
        seed=1,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": PERSON, "strict": True},
        },
    )
    person = json.loads(r.choices[0].message.content)
    jsonschema.validate(person, PERSON)  # raises if the output strays from the schema
    assert r.choices[0].finish_reason == "stop"


@pytest.mark.model
def test_a_schema_keyword_the_grammar_cannot_enforce_is_a_400_naming_it(llama: str) -> None:
    client = sdk(llama)
    bounded = {**PERSON, "properties": {**PERSON["properties"], "age": {"minimum": 0}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": bounded}}
    # The router knows no worker here enforces it (json_schema_full), and says why.
    why = "json_schema_full.*'minimum' at /properties/age"
    with pytest.raises(openai.BadRequestError, match=why):
        client.chat.completions.create(
            model=client.models.list().data[0].id,
            messages=ASK,
            max_tokens=8,
            response_format=fmt,
        )


@pytest.mark.model
def test_json_object_is_a_json_object(llama: str) -> None:
    client = sdk(llama)
    r = client.chat.completions.create(
        model=client.models.list().data[0].id,
        messages=ASK,
        max_tokens=128,
        temperature=0,  # sampled, a long answer may end at max_tokens mid-object
        response_format={"type": "json_object"},
    )
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(r.choices[0].message.content), dict)


@pytest.mark.model
def test_logprobs_whole_and_streamed_agree(llama: str) -> None:
    client = sdk(llama)
    kw = dict(model=client.models.list().data[0].id, messages=ASK, max_tokens=8, temperature=0)
    r = client.chat.completions.create(**kw, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert r.choices[0].finish_reason == "length" and len(content) == 8
    assert "".join(t.token for t in content) == r.choices[0].message.content
    for t in content:
        assert len(t.top_logprobs) == 3 and t.logprob <= 0
        # Greedy: the chosen token is the likeliest, so it leads its alternatives.
        assert t.top_logprobs[0].token == t.token
        assert math.isclose(t.top_logprobs[0].logprob, t.logprob, abs_tol=1e-5)
        tops = [a.logprob for a in t.top_logprobs]
        assert tops == sorted(tops, reverse=True)
    streamed = []
    for chunk in client.chat.completions.create(**kw, logprobs=True, top_logprobs=3, stream=True):
        if chunk.choices and chunk.choices[0].logprobs is not None:
            streamed += chunk.choices[0].logprobs.content
    assert [(t.token, round(t.logprob, 4)) for t in streamed] == [
        (t.token, round(t.logprob, 4)) for t in content
    ]
    text = client.completions.create(
        model=kw["model"], prompt="1, 2, 3,", max_tokens=4, temperature=0, logprobs=2
    ).choices[0]
    assert len(text.logprobs.tokens) == len(text.logprobs.token_logprobs) == 4
    assert text.logprobs.text_offset[0] == 0 and all(
        len(d) <= 2 for d in text.logprobs.top_logprobs
    )


@pytest.mark.model
def test_penalties_and_bias_change_the_text(llama_cluster: tuple[Cluster, str]) -> None:
    cluster, url = llama_cluster
    client = sdk(url)
    # Greedy, the small model repeats the sentence; each penalty breaks the loop.
    kw = dict(
        model=client.models.list().data[0].id,
        prompt="The cat sat. The cat sat. The cat sat.",
        max_tokens=16,
        temperature=0,
    )
    plain = client.completions.create(**kw).choices[0].text
    openai_style = client.completions.create(**kw, frequency_penalty=2.0, presence_penalty=2.0)
    llama_style = client.completions.create(**kw, extra_body={"repetition_penalty": 1.5})
    assert plain.count("cat") >= 3
    assert openai_style.choices[0].text.count("cat") < plain.count("cat")
    assert llama_style.choices[0].text.count("cat") < plain.count("cat")
    with cluster.client() as c:  # the greedy first token's id, from tandem's own client
        first = c.generate(kw["prompt"], max_tokens=1).token_ids[0]
    bias = {"logit_bias": {str(first): -100}, "max_tokens": 1, "logprobs": 0}
    plain_lp, banned = (
        client.completions.create(**{**kw, **b}).choices[0].logprobs
        for b in (bias | {"logit_bias": {}}, bias)
    )
    assert banned.tokens[0] != plain_lp.tokens[0]  # the likeliest token is banned


# ------------------------------------------------------------ a worker that has none
@pytest.mark.parametrize(
    ("extra", "capability"),
    [
        ({"response_format": {"type": "json_object"}}, "json_schema"),
        ({"logprobs": True}, "logprobs"),
        ({"presence_penalty": 0.5}, "penalties"),
    ],
)
def test_a_request_no_worker_can_serve_is_a_400_naming_the_capability(
    sim: str, extra: dict, capability: str
) -> None:
    client = sdk(sim)
    model = client.models.list().data[0].id
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=model, messages=ASK, max_tokens=4, **extra)
    assert capability in err.value.message and "sim0" in err.value.message
    # A request that needs nothing is served as before.
    r = client.chat.completions.create(model=model, messages=ASK, max_tokens=4)
    assert r.choices[0].finish_reason == "length"
