"""min_tokens: no end of generation before it, at every door (gateway, protocol, engine)."""

from __future__ import annotations

import pytest

from tandem.client.session import sampling_params
from tandem.common import protocol as p
from tandem.gateway.errors import ApiError
from tandem.gateway.parse import parse_chat, read_request
from tandem.workers.engine import Engine, EngineConfig
from tandem.workers.request import Request
from tests.helpers import EOS, FakeBackend

USER = [{"role": "user", "content": "hi"}]


def test_gateway_takes_min_tokens_onto_the_sampling():
    g = parse_chat({"messages": USER, "max_tokens": 20, "min_tokens": 5}, 16)
    assert g.sampling.min_tokens == 5
    assert parse_chat({"messages": USER}, 16).sampling.min_tokens == 0


@pytest.mark.parametrize("value", [-1, 1.5, "3", True])
def test_gateway_refuses_a_bad_min_tokens(value):
    with pytest.raises(ApiError) as err:
        parse_chat({"messages": USER, "min_tokens": value}, 16)
    assert err.value.param == "min_tokens"


def test_min_tokens_above_max_tokens_is_a_400_naming_it():
    raw = b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "min_tokens": 9}'
    with pytest.raises(ApiError) as err:
        read_request(raw, True, 16, "r1")
    assert "min_tokens" in str(err.value.message)


def test_the_client_library_and_the_wire_carry_it():
    s = sampling_params(max_tokens=10, min_tokens=4)
    assert s.problem() is None
    assert p.SamplingParams(max_tokens=3, min_tokens=4).problem() is not None
    msg = p.Assign("r", [1, 2], s)
    assert p.decode(p.encode(msg)).sampling.min_tokens == 4


def test_an_engine_whose_backend_does_not_mask_generates_through_early_eos():
    backend = FakeBackend()
    backend.script["r"] = [5]  # then EOS at every position
    out: list[p.Message] = []
    e = Engine(backend, EngineConfig(max_active=2, step_tokens=8), out.append, "w")
    e.submit(Request("r", [1, 2, 3], p.SamplingParams(max_tokens=8, min_tokens=3)))
    while e.queue or e.active:
        e.step()
    done = next(m for m in out if isinstance(m, p.Done))
    assert done.finish_reason is p.FinishReason.EOS
    assert done.stats.output_tokens == 3  # [5, EOS, EOS]: the fourth EOS ends it
    ids = [t for m in out if isinstance(m, p.TokenDelta) for t in m.token_ids]
    assert ids == [5, EOS, EOS]
