"""A Submit's rules live in one function (common/validation.py ``submit_problem``) that
every side runs: the client library and the gateway before a Submit leaves
(``protocol.check``), the router as it decodes one and, for a Submit a driver hands
its core directly, ``validate_submit``. Each refusal is the same words everywhere."""

from __future__ import annotations

import pytest

from tandem.broker.requests import validate_submit
from tandem.client.errors import BadRequest
from tandem.client.session import make_submit
from tandem.common import protocol as p

BAD = [
    (dict(prompt="x", tokens=[1]), "give exactly one of prompt, tokens or messages", None),
    (dict(), "give exactly one of prompt, tokens or messages", None),
    (dict(prompt=""), "prompt is empty", "prompt"),
    (dict(tokens=[]), "tokens is empty", "tokens"),
    (dict(messages=[]), "messages is empty", "messages"),
]


@pytest.mark.parametrize(("given", "words", "field"), BAD)
def test_every_side_refuses_a_submit_in_the_same_words(given, words, field) -> None:
    sub = p.Submit("r1", **given)
    core = validate_submit(sub)  # a Submit handed to the core
    assert core is not None and core.message == words and core.field == field
    wire = p.check(sub)  # the router's decoder, as the library and the gateway run it
    assert wire is not None and wire.message == words and wire.code == p.BAD_REQUEST
    with pytest.raises(BadRequest) as refused:  # the library, before anything is sent
        make_submit(**given)
    assert str(refused.value).startswith(words) and refused.value.field == field


def test_a_good_submit_passes_every_side() -> None:
    sub = make_submit("hello", max_tokens=4)
    assert validate_submit(sub) is None and p.check(sub) is None
