"""The wire protocol: round trips, strict validation, and no crash on any bytes."""

from __future__ import annotations

import contextlib
import typing

import msgpack
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tandem.common import protocol as p

EXAMPLES = [
    p.Hello("cli"),
    p.Welcome("tandem", "phase_cost"),
    p.Submit("r1", prompt="hi", sampling=p.SamplingParams(5, stop=["\n"], seed=3), worker="cpu0"),
    p.Submit(
        "r2", tokens=[1, 2], sampling=p.SamplingParams(temperature=0.7, top_k=4), stream=False
    ),
    p.Submit("r3", messages=[{"role": "user", "content": "hi"}]),
    p.Cancel("r1"),
    p.StatusQuery(),
    p.StatusReply("round_robin", [{"id": "w"}], 2),
    p.Accepted("r1", "cpu0", 12, 8),
    p.TokenDelta("r1", [5, 6], "ab"),
    p.StepTokens(["r1", "r2"], [[5], [6, 7]], ["a", "bc"]),
    p.Submit(
        "r4",
        prompt="hi",
        sampling=p.SamplingParams(
            presence_penalty=-0.5,
            frequency_penalty=2,
            repetition_penalty=1.1,
            min_p=0.05,
            logit_bias={0: -100.0, 2**31: 3.5},
            logprobs=20,
            json_schema='{"type": "object"}',
        ),
    ),
    p.TokenDelta("r1", [5], "a", [p.TokenLogprob(5, "a", -0.1, [(5, "a", -0.1), (6, "b", -2.5)])]),
    p.StepTokens(
        ["r1", "r2"],
        [[5], [6, 7]],
        ["a", "bc"],
        [None, [p.TokenLogprob(6, "b", -1.0), p.TokenLogprob(7, "\ufffd", float("-inf"))]],
    ),
    p.Done("r1", p.FinishReason.LENGTH, p.DoneStats(ttft_s=0.1, worker="cpu0")),
    p.Error(p.BAD_REQUEST, "nope", "r1"),
    p.Error(p.BAD_FRAME, "nope"),
    p.Ready("w", "llama.cpp", "cpu", "m.gguf", 4, 8192, 16, 200.0, [50.0, 80.0], 0.5, {"k": 1}),
    p.Heartbeat("w", 3, [p.RequestRow("a", 9, 0, 0, 4)], [], 10, 100, p.CacheReport(True, 1)),
    p.Heartbeat(
        "w",
        4,
        [],
        [],
        0,
        100,
        p.CacheReport(False, 2, added=[1 << 62], base=1),
        steps=p.StepReport([1], [0.01], [3]),
    ),  # fmt: skip
    p.Assign("a", [1, 2], p.SamplingParams(8, stop=["x"], prefill_only=True)),
    p.Reregister(),
    p.Reregister(tokenizer=True),
    p.Ready("w", "sim", "cpu", "m.gguf", 1, 64, 16, 1.0, [1.0], 0.5, {}, tokenizer_hash="ab"),
    p.Ready(
        "w", "llama.cpp", "cpu", "m", 1, 64, 16, 1.0, [1.0], 0.5, {}, capabilities=["logprobs"]
    ),
    p.Starting("w", "i1", "auto", "m", p.StartStage.MEASURING, 3.5),
    p.StatusReply("lookahead", [], starting=[{"id": "w", "stage": "loading", "eta_s": None}]),
    p.ResyncCache(),
    p.Goodbye("w"),
    p.Batch([{"type": "cancel", "request_id": "r1"}]),
]

V = p.PROTOCOL_VERSION


def test_every_message_type_has_an_example():
    assert {type(m) for m in EXAMPLES} == set(p.MESSAGE_TYPES.values())


@pytest.mark.parametrize("msg", EXAMPLES, ids=lambda m: m.TYPE)
def test_round_trip(msg):
    back = p.decode(p.encode(msg))
    if isinstance(msg, p.Batch):  # its entries stay packed until they are read
        assert p.entries(back) == [p.Cancel("r1")]
    else:
        assert back == msg


def test_integers_are_accepted_where_floats_are_expected():
    msg = p.decode(_frame(type="submit", request_id="r", prompt="x", sampling={"top_p": 1}))
    assert isinstance(msg, p.Submit)
    assert msg.sampling.top_p == 1.0 and isinstance(msg.sampling.top_p, float)


def test_nested_types_are_decoded_and_checked():
    hb = _frame(type="heartbeat", worker_id="w", seq=1, queued=[], kv_used_tokens=0,
                kv_capacity_tokens=1, cache={"full": True, "seq": 1},
                active=[{"id": "a", "prompt": 1}])  # fmt: skip
    with pytest.raises(p.ProtocolError, match="missing field 'cached'"):
        p.decode(hb)
    done = p.decode(_frame(type="done", request_id="r", finish_reason="eos"))
    assert isinstance(done, p.Done) and done.finish_reason is p.FinishReason.EOS


@pytest.mark.parametrize(
    ("sampling", "needle"),
    [
        (p.SamplingParams(max_tokens=0), "max_tokens"),
        (p.SamplingParams(temperature=float("nan")), "temperature"),
        (p.SamplingParams(temperature=float("inf")), "temperature"),
        (p.SamplingParams(top_p=float("nan")), "top_p"),
        (p.SamplingParams(top_p=0.0), "top_p"),
        (p.SamplingParams(top_k=-1), "top_k"),
        (p.SamplingParams(seed=-1), "seed"),
        (p.SamplingParams(stop=[""]), "stop"),
        (p.SamplingParams(stop=["x"] * 17), "stop"),
        (p.SamplingParams(presence_penalty=2.5), "presence_penalty"),
        (p.SamplingParams(frequency_penalty=float("nan")), "frequency_penalty"),
        (p.SamplingParams(repetition_penalty=0.0), "repetition_penalty"),
        (p.SamplingParams(min_p=1.5), "min_p"),
        (p.SamplingParams(logit_bias={1: 100.5}), "logit_bias"),
        (p.SamplingParams(logit_bias={-1: 1.0}), "logit_bias"),
        (p.SamplingParams(logit_bias={i: 1.0 for i in range(301)}), "logit_bias"),
        (p.SamplingParams(logprobs=21), "logprobs"),
        (p.SamplingParams(logprobs=-1), "logprobs"),
        (p.SamplingParams(json_schema=""), "json_schema"),
        (p.SamplingParams(json_schema="{"), "json_schema"),
        (p.SamplingParams(json_schema="[1]"), "json_schema"),
    ],
)
def test_sampling_problems_are_named(sampling, needle):
    problem = p.check(p.Submit("r", prompt="x", sampling=sampling))
    assert problem is not None and problem.code is p.ErrorCode.BAD_REQUEST
    assert needle in problem.message and needle in problem.field
    assert p.SamplingParams(max_tokens=0, prefill_only=True).problem() is None
    assert p.SamplingParams(max_tokens=9).problem(max_tokens_limit=8) is not None


BAD = p.BAD_REQUEST


def test_sampling_names_the_capabilities_it_needs():
    C = p.Capability
    assert p.SamplingParams(temperature=1, top_k=5, seed=1, stop=["x"]).needs() == frozenset()
    assert p.SamplingParams(presence_penalty=0.1).needs() == {C.PENALTIES}
    assert p.SamplingParams(frequency_penalty=-0.1).needs() == {C.PENALTIES}
    assert p.SamplingParams(repetition_penalty=1.1).needs() == {C.PENALTIES}
    assert p.SamplingParams(logit_bias={1: 0.0}).needs() == {C.LOGIT_BIAS}
    assert p.SamplingParams(min_p=0.1).needs() == {C.MIN_P}
    assert p.SamplingParams(logprobs=0).needs() == {C.LOGPROBS}
    every = p.SamplingParams(presence_penalty=1, logit_bias={1: 1}, min_p=0.1, logprobs=1,
                             json_schema='{"maximum": 3}')  # fmt: skip
    assert every.needs() == set(C) and {"json_schema", "logprobs"} <= every.needs()
    assert p.SamplingParams(json_schema="true").needs() == {C.JSON_SCHEMA}


@pytest.mark.parametrize(
    "msg",
    [
        p.TokenDelta("r", [1, 2], "ab", [p.TokenLogprob(1, "a", -1.0)]),
        p.StepTokens(["r"], [[1]], ["a"], [None, None]),
        p.StepTokens(["r"], [[1]], ["a"], [[p.TokenLogprob(1, "a", 0.0)] * 2]),
        p.TokenDelta("r", [1], "a", [p.TokenLogprob(1, "a", float("nan"))]),
        p.TokenDelta("r", [1], "a", [p.TokenLogprob(1, "a", -1.0, [(2, "b", -1.0)] * 21)]),
    ],
)
def test_logprobs_must_match_their_tokens(msg):
    assert p.check(msg) is not None


OLD = p.PROTOCOL_VERSION - 1  # an older peer
KEEP = object()  # an edit that keeps the value


def _frame(**body):
    return msgpack.packb({"v": V, **body})


@pytest.mark.parametrize(
    ("frame", "code", "needle"),
    [
        (b"\xc1", p.BAD_FRAME, "msgpack"),
        (msgpack.packb("a string"), p.BAD_FRAME, "map"),
        (msgpack.packb({"type": "hello"}), p.VERSION_MISMATCH, "version"),
        (msgpack.packb({"v": 1, "type": "hello"}), p.VERSION_MISMATCH, "version"),
        (_frame(type="warp"), p.BAD_FRAME, "unknown message type"),
        (_frame(type=7), p.BAD_FRAME, "unknown message type"),
        (_frame(type="cancel"), p.BAD_REQUEST, "missing field 'request_id'"),
        (_frame(type="cancel", request_id="r", extra=1), p.BAD_REQUEST, "unknown field"),
        (_frame(type="submit", request_id="r", sampling={"max_tokens": "9"}), BAD, "max_tokens"),
        (_frame(type="submit", request_id="r", sampling={"max_tokens": True}), BAD, "max_tokens"),
        (_frame(type="submit", request_id="r", sampling={"warp": 1}), BAD, "unknown field"),
        (_frame(type="submit", request_id="r", sampling=[1]), BAD, "sampling"),
        (_frame(type="submit", request_id="r", tokens=[1, "2"]), p.BAD_REQUEST, "tokens"),
        (_frame(type="submit", request_id="r", sampling={"stop": "x"}), BAD, "stop"),
        (_frame(type="done", request_id="r", finish_reason="tired"), BAD, "finish_reason"),
        (_frame(type="error", code="oops", message="m"), BAD, "code"),
        (_frame(type="submit", request_id=None), p.BAD_REQUEST, "request_id"),
    ],
)
def test_rejections_carry_a_code_and_a_clear_message(frame, code, needle):
    with pytest.raises(p.ProtocolError) as info:
        p.decode(frame)
    assert info.value.code == code
    assert needle in info.value.message


def test_non_string_keys_are_rejected():
    for key in (b"request_id", 1):
        with pytest.raises(p.ProtocolError) as info:
            frame = {"v": p.PROTOCOL_VERSION, "type": "cancel", key: "r"}
            p.decode(msgpack.packb(frame, use_bin_type=True))
        assert info.value.code == p.BAD_FRAME


def test_rejection_keeps_the_request_id_when_readable():
    with pytest.raises(p.ProtocolError) as info:
        p.decode(_frame(type="submit", request_id="abc", sampling={"max_tokens": "x"}))
    assert info.value.request_id == "abc"


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_only_ever_raise_protocol_error(data):
    with contextlib.suppress(p.ProtocolError):
        p.decode(data)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(sorted(p.MESSAGE_TYPES)),
    st.dictionaries(st.text(max_size=12), json_values, max_size=6),
)
def test_arbitrary_maps_decode_to_valid_messages_or_raise_protocol_error(tag, body):
    try:
        msg = p.decode(msgpack.packb({**body, "v": V, "type": tag}))
    except p.ProtocolError:
        return
    for f in msgspec.structs.fields(msg):  # a decoded message always re-encodes
        assert f.name in body or not f.required
    assert p.decode(p.encode(msg)) == msg


# ------------------------------------------------------------ batch frames
def test_a_batch_unpacks_to_its_messages_in_order():
    msgs = [m for m in EXAMPLES if not isinstance(m, p.Batch)]
    frame = p.encode_batch(msgs)
    assert p.decode_all(frame) == msgs
    assert p.join_batch([p.batch_entry(m) for m in msgs]) == frame
    assert p.decode_all(p.encode(msgs[0])) == [msgs[0]]  # a plain frame: its one message
    many = [p.TokenDelta(f"r{i}", [i], "x") for i in range(70_000 // 20)]  # a 2-byte count
    assert p.decode_all(p.encode_batch(many)) == many


def test_a_bad_entry_is_refused_in_its_place_and_the_others_still_count():
    entries = [
        {"type": "tokens", "request_id": "r1", "token_ids": [-1], "text": ""},
        {"type": "batch", "messages": [{"type": "cancel", "request_id": "x"}]},
        {"type": "cancel", "request_id": "r2"},
        {"v": V, "type": "cancel", "request_id": "r3"},  # the frame's v covers its entries
        {"type": "warp", "request_id": "r4"},
        {"type": "done", "request_id": "r5", "finish_reason": "length"},
    ]
    out = p.decode_all(_frame(type="batch", messages=entries))
    assert [type(m).__name__ for m in out] == [
        "ProtocolError", "ProtocolError", "Cancel", "ProtocolError", "ProtocolError", "Done"
    ]  # fmt: skip
    assert "token_ids[0]" in out[0].message and out[0].request_id == "r1"
    assert "in a batch" in out[1].message and out[1].code == p.BAD_FRAME
    assert "unknown field" in out[3].message and out[3].request_id == "r3"
    assert out[4].code == p.BAD_FRAME and out[4].request_id == "r4"


def test_an_entry_with_other_than_string_keys_is_refused_in_its_place():
    out = p.decode_all(
        _frame(type="batch", messages=[{1: 2}, {"type": "cancel", "request_id": "r"}])
    )
    assert isinstance(out[0], p.ProtocolError) and out[0].code == p.BAD_FRAME
    assert out[1] == p.Cancel("r")


@pytest.mark.parametrize(
    ("messages", "needle"),
    [([], "messages: expected array of length >= 1"),
     ([{"type": "cancel", "request_id": "r"}] * 4097, "length <= 4096"),
     ("x", "messages"), ([1], "messages")],
)  # fmt: skip
def test_a_malformed_batch_is_refused_whole(messages, needle):
    with pytest.raises(p.ProtocolError) as info:
        p.decode_all(_frame(type="batch", messages=messages))
    assert needle in info.value.message


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(sorted(p.MESSAGE_TYPES)),
            st.dictionaries(st.text(max_size=12), json_values, max_size=6),
        ),
        min_size=1,
        max_size=4,
    )
)
def test_arbitrary_batch_entries_decode_to_messages_or_protocol_errors(entries):
    frame = _frame(type="batch", messages=[{**body, "type": tag} for tag, body in entries])
    try:
        out = p.decode_all(frame)
    except p.ProtocolError:
        return
    assert len(out) == len(entries)
    for msg in out:
        assert isinstance(msg, p.ProtocolError) or p.decode(p.encode(msg)) == msg


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_after_a_batch_head_only_ever_raise_protocol_error(data):
    with contextlib.suppress(p.ProtocolError):
        p.decode_all(_frame(type="batch", messages=[])[:-1] + data)


def test_keys_other_than_strings_inside_free_form_values_are_refused():
    frame = _frame(type="submit", request_id="r", messages=[{"a": {1: 2}}])
    with pytest.raises(p.ProtocolError, match="keys must be strings"):
        p.decode(frame)
    bad = {"type": "submit", "request_id": "r", "messages": [{"a": {1: 2}}]}
    (entry,) = p.decode_all(_frame(type="batch", messages=[bad]))
    assert isinstance(entry, p.ProtocolError) and "keys must be strings" in entry.message


def _float_fields(cls, where=""):
    """(path, nested class or None) of every float field, nested Structs included."""
    hints = typing.get_type_hints(cls)
    for name in cls.__struct_fields__:
        hint = hints[name]
        if isinstance(hint, type) and issubclass(hint, msgspec.Struct):
            yield from _float_fields(hint, f"{where}{name}.")
        elif float in (hint, *typing.get_args(hint), *map(typing.get_args, typing.get_args(hint))):
            yield f"{where}{name}", hint


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize(
    ("msg", "path"),
    [(m, path) for m in EXAMPLES for path, _ in _float_fields(type(m))],
    ids=lambda x: x if isinstance(x, str) else x.TYPE,
)
def test_every_float_field_refuses_what_is_not_a_finite_number(msg, path, bad):
    """Every declared float's bounds (its type's Meta) refuse NaN and infinities."""
    body = msgpack.unpackb(p.encode(msg), strict_map_key=False)  # logit_bias: int keys
    *outer, name = path.split(".")
    target = body
    for part in outer:
        target = target.setdefault(part, {})  # a nested value at its default is absent
    target[name] = [bad] if isinstance(target.get(name), list) else bad  # absent: a default
    with pytest.raises(p.ProtocolError):
        p.decode(msgpack.packb(body))


def test_a_worker_checks_only_its_own_limit_on_the_output_budget():
    """The door's rules (the schema's JSON among them) are not the worker's to redo."""
    schema = p.SamplingParams(max_tokens=4, json_schema="not json")
    assert schema.problem() is not None and schema.over_limit(8) is None
    assert p.SamplingParams(max_tokens=9).over_limit(8).field == "sampling.max_tokens"
    assert p.SamplingParams(max_tokens=0).over_limit(8) is not None
    assert p.SamplingParams(max_tokens=0, prefill_only=True).over_limit(8) is None
