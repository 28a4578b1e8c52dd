"""OpenAI's penalties, logit_bias, min_p, response_format and logprobs -> SamplingParams
fields (gateway/sampling.py), and the logprobs they answer with in OpenAI's shapes."""

from __future__ import annotations

import json

import pytest

from tandem.gateway.errors import ApiError
from tandem.gateway.sampling import JSON_OBJECT_SCHEMA, sampling_options

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def test_absent_fields_ask_for_nothing():
    assert sampling_options({}, chat=True) == {}
    assert sampling_options({"response_format": {"type": "text"}}, chat=True) == {}


def test_fields_map_onto_sampling_params():
    body = {
        "presence_penalty": 1,
        "frequency_penalty": -0.5,
        "repetition_penalty": 1.1,
        "min_p": 0.05,
        "logit_bias": {"15": -100, "7": 2.5},
        "logprobs": True,
        "top_logprobs": 4,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}},
    }
    got = sampling_options(body, chat=True)
    assert got == {
        "presence_penalty": 1.0,
        "frequency_penalty": -0.5,
        "repetition_penalty": 1.1,
        "min_p": 0.05,
        "logit_bias": {15: -100.0, 7: 2.5},
        "logprobs": 4,
        "json_schema": json.dumps(SCHEMA, separators=(",", ":")),
    }
    assert json.loads(got["json_schema"]) == SCHEMA
    assert sampling_options({"logprobs": True}, chat=True) == {"logprobs": 0}
    assert sampling_options({"logprobs": False}, chat=True) == {}
    assert sampling_options({"logprobs": 3}, chat=False) == {"logprobs": 3}
    json_object = {"response_format": {"type": "json_object"}}
    assert sampling_options(json_object, chat=True) == {"json_schema": JSON_OBJECT_SCHEMA}


@pytest.mark.parametrize(
    ("body", "chat", "param"),
    [
        ({"presence_penalty": "1"}, True, "presence_penalty"),
        ({"min_p": True}, True, "min_p"),
        ({"logit_bias": [1, 2]}, True, "logit_bias"),
        ({"logit_bias": {"tok": 1}}, True, "logit_bias"),
        ({"logit_bias": {"-5": 1}}, True, "logit_bias"),
        ({"logit_bias": {"5": "x"}}, False, "logit_bias"),
        ({"logprobs": 2}, True, "logprobs"),  # chat's is a boolean
        ({"logprobs": True}, False, "logprobs"),  # completions' is a number
        ({"top_logprobs": 2}, True, "top_logprobs"),  # without logprobs: true
        ({"logprobs": True, "top_logprobs": 1.5}, True, "top_logprobs"),
        ({"response_format": {"type": "xml"}}, True, "response_format"),
        ({"response_format": "json"}, True, "response_format"),
        ({"response_format": {"type": "json_schema"}}, True, "response_format"),
        ({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}}, True,
         "response_format"),  # no name
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": 3}}},
         True, "response_format"),
    ],
)  # fmt: skip
def test_wrong_types_are_400s_naming_the_openai_field(body, chat, param):
    with pytest.raises(ApiError) as err:
        sampling_options(body, chat)
    assert err.value.status == 400 and err.value.param == param
