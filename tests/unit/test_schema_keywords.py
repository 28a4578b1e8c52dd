"""A JSON schema llama.cpp's grammar would only half honour is refused, naming the
keyword (common/schema_keywords.py), and the list of such keywords matches
what llama-cpp-python's converter really leaves out."""

from __future__ import annotations

import json

import pytest
from llama_cpp.llama_grammar import json_schema_to_gbnf

from tandem.common.schema_keywords import UNENFORCED, unenforced

BASE = {"type": "object", "properties": {"n": {"type": "integer"}, "s": {"type": "string"}},
        "required": ["n", "s"]}  # fmt: skip


def with_keyword(key: str) -> dict:
    schema = json.loads(json.dumps(BASE))
    values = {"minimum": 0, "maximum": 9, "exclusiveMinimum": 0, "exclusiveMaximum": 9,
              "multipleOf": 2, "not": {"const": 3}}  # fmt: skip
    if key in values:
        schema["properties"]["n"][key] = values[key]
    elif key == "uniqueItems":
        schema["properties"]["n"] = {"type": "array", "items": {"type": "integer"}, key: True}
    elif key == "patternProperties":
        schema[key] = {"^x": {"type": "integer"}}
    else:  # minProperties / maxProperties
        schema[key] = 1
    return schema


@pytest.mark.parametrize("key", sorted(UNENFORCED))
def test_each_listed_keyword_leaves_the_grammar_as_it_was(key: str) -> None:
    """If the library starts enforcing one, this fails: drop it from UNENFORCED."""
    schema = with_keyword(key)
    plain = json.loads(json.dumps(schema))
    plain["properties"]["n"].pop(key, None)
    plain.pop(key, None)
    if key == "uniqueItems":
        plain["properties"]["n"].pop("uniqueItems", None)
    assert json_schema_to_gbnf(json.dumps(schema)) == json_schema_to_gbnf(json.dumps(plain))
    assert unenforced(schema) is not None and key in unenforced(schema)


@pytest.mark.parametrize(
    "extra", [{"minLength": 2}, {"maxLength": 5}, {"pattern": "^a+$"}, {"format": "date"}]
)
def test_enforced_string_keywords_change_the_grammar_and_pass(extra: dict) -> None:
    schema = json.loads(json.dumps(BASE))
    schema["properties"]["s"].update(extra)
    assert json_schema_to_gbnf(json.dumps(schema)) != json_schema_to_gbnf(json.dumps(BASE))
    assert unenforced(schema) is None


def test_the_refusal_says_where_and_names_are_not_keywords() -> None:
    schema = {"type": "object", "properties": {"minimum": {"type": "integer", "maximum": 3}}}
    assert unenforced(schema) == "'maximum' at /properties/minimum"
    assert unenforced({"type": "string", "format": "email"}) == "'format: email' at /"
    assert unenforced({"anyOf": [{"type": "integer"}, {"type": "number", "minimum": 1}]}) == (
        "'minimum' at /anyOf/1"
    )
    assert unenforced({"enum": [{"minimum": 1}]}) is None  # data, not a schema
    assert unenforced({"$defs": {"not": {"type": "integer"}}, "$ref": "#/$defs/not"}) is None


def test_a_llama_worker_refuses_such_a_schema_when_the_request_arrives() -> None:
    from tandem.common.protocol import SamplingParams
    from tandem.workers.backends.llama_sampling import request_problem
    from tandem.workers.request import Request

    schema = json.dumps({"type": "object", "properties": {"n": {"minimum": 0}}})
    req = Request("r", [1, 2], SamplingParams(max_tokens=4, json_schema=schema))
    problem = request_problem(req, vocab=None)  # refused before the vocabulary is needed
    assert problem is not None
    assert "'minimum' at /properties/n" in problem and "not enforced" in problem
