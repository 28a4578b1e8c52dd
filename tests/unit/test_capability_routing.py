"""Capabilities are routing's first hard constraint (broker/capabilities.py): a request
goes only to a worker that advertises what it needs; the cost model chooses among
those; a request no registered worker can serve is a BAD_REQUEST naming what is
missing, at once. Through the live router loop on inproc sockets (tests/helpers.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tandem.common import protocol as p
from tests.helpers import Harness

FAST, SLOW = (4000.0, [400.0] * 4), (500.0, [50.0] * 4)  # prefill, decode tok/s
ALL = [str(c) for c in p.Capability]
PROMPT = list(range(1, 40))


@pytest.fixture
def h(tmp_path: Path):
    h = Harness(tmp_path)
    yield h
    h.close()


def send(h: Harness, rid: str, worker: str | None = None, **sampling: Any) -> p.Message | None:
    """Submit a request; the router's first answer to it (None: it waits)."""
    sub = p.Submit(rid, tokens=PROMPT, sampling=p.SamplingParams(8, **sampling), worker=worker)
    h.client.send(sub)
    h.pump()
    return h.recv(h.client) if h.client.poll(200) else None


def test_a_request_goes_only_to_a_worker_with_what_it_needs(h: Harness):
    h.add_worker("plain", FAST, capabilities=[])  # cheaper: the cost model's choice
    h.add_worker("full", SLOW, capabilities=ALL)
    for rid, sampling, expected in [
        ("r0", {}, "plain"),
        ("r1", {"json_schema": '{"type": "object"}'}, "full"),
        ("r2", {"logprobs": 2}, "full"),
        ("r3", {"presence_penalty": 0.5}, "full"),
        ("r4", {"logit_bias": {5: -100.0}}, "full"),
        ("r5", {"min_p": 0.1}, "full"),
    ]:
        msg = send(h, rid, **sampling)
        assert isinstance(msg, p.Accepted) and msg.worker_id == expected, (rid, msg)
    logged = {d["request"]: d for d in h.decisions()}
    assert logged["r1"]["excluded"] == {"plain": "lacks json_schema"}
    assert logged["r1"]["needs"] == ["json_schema"]
    assert [c["id"] for c in logged["r1"]["candidates"]] == ["full"]
    assert "excluded" not in logged["r0"]


def test_a_request_no_registered_worker_can_serve_fails_at_once(h: Harness):
    h.add_worker("a", FAST, capabilities=["logprobs"])
    h.add_worker("b", FAST, capabilities=["penalties"])
    msg = send(h, "r0", json_schema="{}", logprobs=0)
    assert isinstance(msg, p.Error) and msg.code == p.BAD_REQUEST
    assert "json_schema" in msg.message and "a lacks json_schema" in msg.message
    # Each has one of the two, none both: said so.
    msg = send(h, "r1", presence_penalty=1.0, logprobs=0)
    assert isinstance(msg, p.Error) and msg.code == p.BAD_REQUEST
    assert "all of logprobs, penalties together" in msg.message
    assert isinstance(send(h, "r2", logprobs=1), p.Accepted)  # the router goes on serving


def test_with_no_worker_registered_it_waits_for_one_that_can(h: Harness):
    assert send(h, "r0", json_schema="{}") is None  # held, as any request before a worker
    h.add_worker("full", SLOW, capabilities=ALL)
    h.pump()
    msg = h.recv(h.client)
    assert isinstance(msg, p.Accepted) and msg.worker_id == "full"


def test_a_request_pinned_to_a_worker_without_it_is_refused(h: Harness):
    h.add_worker("plain", FAST, capabilities=[])
    h.add_worker("full", SLOW, capabilities=ALL)
    msg = send(h, "r0", worker="plain", logprobs=0)
    assert isinstance(msg, p.Error) and msg.code == p.BAD_REQUEST
    assert "'plain'" in msg.message and "logprobs" in msg.message
    msg = send(h, "r1", worker="full", logprobs=0)
    assert isinstance(msg, p.Accepted) and msg.worker_id == "full"


def test_status_shows_each_workers_capabilities(h: Harness):
    h.add_worker("plain", FAST, capabilities=[])
    h.add_worker("full", SLOW, capabilities=ALL)
    rows = {w["id"]: w for w in h.core.status(0.0).workers}
    assert rows["plain"]["capabilities"] == [] and rows["full"]["capabilities"] == sorted(ALL)


def test_status_and_top_show_capabilities_in_a_short_column(h: Harness):
    from rich.console import Console

    from tandem.cli import tables, top

    h.add_worker("plain", FAST, capabilities=[])
    h.add_worker("part", FAST, capabilities=["logprobs", "penalties"])
    h.add_worker("full", SLOW, capabilities=ALL)
    reply = h.core.status(0.0)
    cells = {w["id"]: tables.capabilities_cell(w) for w in reply.workers}
    assert cells == {"plain": "------", "part": "P--L--", "full": "PBMLJF"}
    text = tables.workers_table(reply)
    assert "caps" in text and "P--L--" in text and "J json_schema" in text
    console = Console(width=240, record=True)
    console.print(top.workers_table(reply.workers))
    shown = console.export_text()
    assert "PBMLJF" in shown and "------" in shown and "L logprobs" in shown


def test_route_explain_and_the_decisions_table_say_who_was_excluded(h: Harness, tmp_path: Path):
    from click.testing import CliRunner

    from tandem.cli.main import main
    from tandem.cli.route import decisions_table

    worker = {"prefill_rate": 1000, "decode_rate": 50}
    state = {
        "request": {"prompt_tokens": 100, "max_tokens": 10, "needs": ["json_schema"]},
        "workers": [
            {"id": "fast", **worker, "decode_rate": 500, "capabilities": ["logprobs"]},
            {"id": "slow", **worker, "capabilities": ["json_schema", "logprobs"]},
        ],
    }
    path = tmp_path / "state.json"
    path.write_text(json.dumps(state))
    out = CliRunner().invoke(main, ["route", "explain", str(path), "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout) | {"scores": None} == {
        "choice": "slow", "scores": None, "excluded": {"fast": "lacks json_schema"}
    }  # fmt: skip
    table = CliRunner().invoke(main, ["route", "explain", str(path)])
    assert "excluded fast: lacks json_schema" in table.stderr
    h.add_worker("plain", FAST, capabilities=[])
    h.add_worker("full", SLOW, capabilities=ALL)
    send(h, "r0", logprobs=1)
    assert "excluded: lacks logprobs" in decisions_table(h.decisions())


def test_logprobs_are_relayed_unchanged_streamed_or_not(h: Harness):
    h.add_worker("full", SLOW, capabilities=ALL)
    a = p.TokenLogprob(7, "a", -0.5, [(7, "a", -0.5), (8, "b", -1.0)])
    b = p.TokenLogprob(8, "b", float("-inf"), [(7, "a", -0.1), (8, "b", float("-inf"))])
    got = {}
    for rid, stream in (("s", True), ("n", False)):
        sub = p.Submit(rid, tokens=PROMPT, sampling=p.SamplingParams(8, logprobs=2), stream=stream)
        h.client.send(sub)
        h.pump()
        wid = h.assigned("full").request_id
        worker = h.workers["full"]
        worker.send(p.StepTokens([wid], [[7]], ["a"], [[a]]))  # a step's frame
        worker.send(p.TokenDelta(wid, [8], "b", [b]))  # a lone delta
        worker.send(p.Done(wid, p.FinishReason.LENGTH))
        h.pump()
        msgs = [h.recv(h.client)]
        while not isinstance(msgs[-1], p.Done):
            msgs.append(h.recv(h.client))
        got[rid] = [x for m in msgs if isinstance(m, p.TokenDelta) for x in m.logprobs or []]
    assert got == {"s": [a, b], "n": [a, b]}


def test_a_schema_with_keywords_beyond_the_core_goes_where_they_are_enforced(h: Harness):
    """llama.cpp's grammar leaves numeric bounds out (a llama.cpp worker refuses such a
    schema); MLX's llguidance enforces them: json_schema_full sends the request there,
    even when the other worker is the cost model's choice."""
    h.add_worker("llama", FAST, capabilities=["json_schema"])
    h.add_worker("mlx", SLOW, capabilities=["json_schema", "json_schema_full"])
    core = json.dumps({"type": "object", "properties": {"n": {"type": "integer"}}})
    bounded = json.dumps({"type": "object", "properties": {"n": {"minimum": 0}}})
    assert p.SamplingParams(json_schema=core).needs() == {"json_schema"}
    assert p.SamplingParams(json_schema=bounded).needs() == {"json_schema", "json_schema_full"}
    first = send(h, "core", json_schema=core)
    second = send(h, "bounded", json_schema=bounded)
    assert isinstance(first, p.Accepted) and first.worker_id == "llama"
    assert isinstance(second, p.Accepted) and second.worker_id == "mlx"
    assert {d["request"]: d for d in h.decisions()}["bounded"]["excluded"] == {
        "llama": "lacks json_schema_full"
    }
