"""Faults, strangers and floods without processes: bounds on decoded fields, request
ownership, admission, liveness, migration in the engine and the client's mailboxes.

The router runs in-process on inproc:// sockets, pumped by hand (tests/helpers.py).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from tandem.broker.admission import Admission, AdmissionConfig
from tandem.broker.identity import RequestIds
from tandem.broker.liveness import STALL_S, Liveness
from tandem.client import BadRequest, Client
from tandem.common import protocol as p
from tandem.common.auth import exposed
from tandem.common.transport import RouterSocket
from tandem.workers.engine import Engine, EngineConfig
from tandem.workers.request import Request
from tests.helpers import FakeBackend, Harness, tiny_tokenizer

FAST = (2551.0, [293.0, 533.0, 732.0, 902.0])


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(tmp_path, policy="least_loaded")
    yield harness
    harness.close()


def ready(**kw: object) -> p.Ready:
    fields: dict = dict(worker_id="w", backend="sim", device="d", model="m", max_active=4,
                        n_ctx=8192, block_size=16, prefill_tok_s=100.0, decode_tok_s=[50.0],
                        heartbeat_s=0.5, tokenizer=tiny_tokenizer())  # fmt: skip
    fields.update(kw)
    return p.Ready(**fields)


IDLE = p.CacheReport(full=False, seq=1, base=1)  # a cache report of no change


def rows_hb(active: list[tuple], queued: tuple[tuple, ...] | list[tuple] = ()) -> p.Heartbeat:
    """A heartbeat listing these rows (id, prompt, cached, prefill left, decode left)."""
    return p.Heartbeat("w", 1, [p.RequestRow(*r) for r in active],
                       [p.RequestRow(*r) for r in queued], 0, 1, IDLE)  # fmt: skip


# ------------------------------------------------------------ bounds on decoded fields
@pytest.mark.parametrize(
    "msg, needle",
    [
        (ready(prefill_tok_s=float("nan")), "prefill_tok_s"),
        (ready(decode_tok_s=[float("inf")]), r"decode_tok_s\[0\]"),
        (ready(heartbeat_s=1e9), "heartbeat_s"),
        (ready(max_active=10**9), "max_active"),
        (ready(worker_id="x" * 1000), "worker_id"),
        (ready(decode_tok_s=[1.0] * 5), "decode_tok_s"),
        (
            p.Heartbeat("w", 1, [p.RequestRow("r", -1, 0, 0, 0)], [], 0, 1, IDLE),
            r"active\[0\].prompt",
        ),
        (rows_hb([("a", 1, 0, 0, 0)], [("b", 1, 0, 0, 2**41)]), "decode_remaining"),
        (rows_hb([("a", 1, 0, 0, 0), ("b\x00", 1, 0, 0, 0)]), r"active\[1\].id"),
        (rows_hb([], [("", 1, 0, 0, 0)]), r"queued\[0\].id"),
        (p.Submit("r", messages=[{"a": [[[[[[[[[[1]]]]]]]]]]}]), "nest"),
        (p.Done("r", p.FinishReason.LENGTH, p.DoneStats(prefill_s="soon")), "prefill_s"),
        (p.TokenDelta("r", [-5], ""), r"token_ids\[0\]"),
        (p.Submit("r", prompt="x", sampling=p.SamplingParams(temperature=float("nan"))), "temp"),
        (p.Error(p.OVERLOADED, "full", "r", retry_after_s=-1.0), "retry_after_s"),
    ],
)
def test_out_of_bounds_fields_are_refused_by_the_decoder(msg: p.Message, needle: str) -> None:
    with pytest.raises(p.ProtocolError, match=needle) as exc:
        p.decode(p.encode(msg))
    assert exc.value.code == p.BAD_REQUEST


def test_in_bounds_messages_still_decode() -> None:
    for msg in (ready(), p.Done("r", p.FinishReason.EOS, p.DoneStats(prefill_s=0.1, worker="w"))):
        assert p.decode(p.encode(msg)) == msg


# ------------------------------------------------------------ identity and ownership
def test_request_ids_of_two_router_starts_never_collide() -> None:
    a, b = RequestIds(), RequestIds()
    first = {a.next() for _ in range(100)}
    assert not first & {b.next() for _ in range(100)} and len(first) == 100


def pinned_to_a(h: Harness) -> str:
    """Workers a and b; request r1 pinned to a. Its worker-side id."""
    h.add_worker("a", FAST)
    h.add_worker("b", FAST)
    h.client.send(p.Submit("r1", tokens=[1, 2, 3], worker="a"))
    h.pump()
    assert isinstance(h.recv(h.client), p.Accepted)
    return h.assigned("a").request_id


def test_tokens_from_a_worker_that_does_not_own_the_request_are_dropped(h: Harness) -> None:
    wid = pinned_to_a(h)
    assert wid.startswith(h.core.ids.epoch + ".")
    h.workers["b"].send(p.TokenDelta(wid, [9], "forged"))
    h.workers["b"].send(p.Done(wid, p.FinishReason.LENGTH))
    h.pump()
    assert not h.client.poll(50)
    h.workers["a"].send(p.TokenDelta(wid, [5], "t5"))
    h.pump()
    assert h.recv(h.client) == p.TokenDelta("r1", [5], "t5")


def test_a_live_worker_id_cannot_be_taken_by_another_connection(h: Harness) -> None:
    h.add_worker("a", FAST)
    from tandem.common.transport import DealerSocket

    thief = DealerSocket(h.router.worker_sock.address, identity=b"thief")
    thief.send(ready(worker_id="a", model="m.gguf", tokenizer=h.spec))
    h.pump()
    assert not thief.poll(50)  # ignored: no Welcome, no eviction
    assert h.core.workers["a"].identity == b"a"
    thief.close()


# ------------------------------------------------------------ admission
def test_past_the_pending_bound_a_submit_is_overloaded_with_a_retry_hint(tmp_path: Path) -> None:
    h = Harness(tmp_path, admission=AdmissionConfig(max_pending=2))
    try:
        for i in range(3):  # no worker yet: they wait (no_worker_wait_s)
            h.client.send(p.Submit(f"r{i}", tokens=[1, 2]))
        h.pump()
        err = h.recv(h.client)
        assert isinstance(err, p.Error) and (err.code, err.request_id) == (p.OVERLOADED, "r2")
        assert err.retry_after_s and err.retry_after_s > 0
        assert len(h.core.pending) == 2
    finally:
        h.close()


def test_a_worker_at_its_inflight_cap_leaves_requests_waiting_in_order(tmp_path: Path) -> None:
    h = Harness(tmp_path, admission=AdmissionConfig(queue_per_slot=0))
    try:
        h.add_worker("a", (100.0, [50.0]), max_active=1)
        h.submit("r0", [1, 2, 3])
        h.client.send(p.Submit("r1", tokens=[4, 5, 6]))
        h.pump()
        assert not h.client.poll(50) and [r.submit.request_id for r in h.core.pending] == ["r1"]
        first = h.assigned("a")
        h.workers["a"].send(p.Done(first.request_id, p.FinishReason.LENGTH))
        h.pump()
        assert isinstance(h.recv(h.client), p.Done)
        assert h.recv(h.client).request_id == "r1"  # Accepted once there is room
    finally:
        h.close()


def test_prompts_over_the_size_limit_are_refused_before_tokenizing() -> None:
    adm = Admission(AdmissionConfig(max_prompt_chars=10, max_prompt_tokens=4))
    assert adm.prompt_problem(p.Submit("r", prompt="x" * 11)).code == p.PROMPT_TOO_LONG
    assert adm.prompt_problem(p.Submit("r", tokens=[1] * 5)).code == p.PROMPT_TOO_LONG
    msgs = [{"role": "user", "content": "y" * 11}]
    assert adm.prompt_problem(p.Submit("r", messages=msgs)).code == p.PROMPT_TOO_LONG
    assert adm.prompt_problem(p.Submit("r", prompt="ok")) is None


def test_the_retry_hint_follows_the_completion_rate() -> None:
    adm = Admission(AdmissionConfig())
    assert adm.retry_after_s(10) == 1.0  # nothing finished yet: a guess
    for i in range(50):
        adm.on_done(100.0 + 0.5 * i)  # two completions a second
    assert adm.retry_after_s(10) == pytest.approx(5.0)
    with pytest.raises(ValueError):
        AdmissionConfig(max_pending=0)
    small = Admission(AdmissionConfig(max_pending_units=100))
    assert small.full_problem(n_pending=1, units=100) is None
    assert small.full_problem(n_pending=1, units=101).code == p.OVERLOADED


# ------------------------------------------------------------ liveness
def test_a_stall_of_the_loop_never_counts_against_workers() -> None:
    live = Liveness(no_progress_s=30.0)
    assert live.silent_for(last_seen=10.0, now=20.0) == 10.0
    live.turn_took(start=11.0, end=11.0 + STALL_S + 8.0)  # the loop was away 8 s
    assert live.silent_for(last_seen=10.0, now=20.0) == pytest.approx(20.0 - 19.5)


def test_a_worker_holding_requests_without_progress_is_stuck() -> None:
    live = Liveness(no_progress_s=5.0)
    assert live.stuck_for("w", holds=False, now=0.0) == 0.0
    live.on_heartbeat("w", remaining=40, holds=True, now=1.0)
    live.on_heartbeat("w", remaining=40, holds=True, now=9.0)  # same work left: no progress
    assert live.stuck_for("w", holds=True, now=9.0) == pytest.approx(8.0)
    assert "no progress" in live.why_expired("w", 9.0, window_s=3.0, holds=True, now=9.0)
    assert "silent" in live.why_expired("w", 1.0, window_s=3.0, holds=True, now=9.0)
    live.on_heartbeat("w", remaining=39, holds=True, now=9.5)
    assert live.stuck_for("w", holds=True, now=10.0) == pytest.approx(0.5)
    live.on_disconnect(now=10.0)
    assert live.probe_due(10.0) and not live.probe_due(10.01) and live.probe_due(10.06)


def test_only_tcp_addresses_off_loopback_count_as_exposed() -> None:
    assert exposed("tcp://0.0.0.0:5556") and exposed("tcp://*:5556") and exposed("tcp://10.0.0.2:1")
    assert not any(map(exposed, ["tcp://127.0.0.1:1", "tcp://localhost:1", "ipc:///tmp/x"]))


# ------------------------------------------------------------ the worker side
def make_engine() -> tuple[Engine, FakeBackend, list[p.Message]]:
    backend, out = FakeBackend(), []
    cfg = EngineConfig(
        max_active=2,
        step_tokens=8,
        block_size=4,
        cache_tokens=64,
        cache_entries=8,
        heartbeat_s=0.5,
        max_tokens_limit=64,
    )
    return Engine(backend, cfg, out.append, "w0"), backend, out


def test_a_migrated_stream_continues_a_stop_string_held_across_the_move() -> None:
    # The old worker emitted "<100>" and held "<101>" (it may start the stop string).
    e, backend, out = make_engine()
    sampling = p.SamplingParams(max_tokens=8, stop=["<101><102>"])
    e.handle(p.Assign("m", [1, 2, 3, 100, 101], sampling, resume=2))
    backend.script["m"] = [102, 103]
    for _ in range(20):
        if not (e.queue or e.active):
            break
        e.step()
    text = "".join(m.text for m in out if isinstance(m, p.TokenDelta))
    done = [m for m in out if isinstance(m, p.Done)]
    assert text == "" and done[0].finish_reason == p.FinishReason.STOP


def test_a_new_registration_drops_the_old_one_s_requests_silently() -> None:
    e, _, out = make_engine()
    for i in range(3):
        e.submit(Request(f"r{i}", [1, 2, 3], p.SamplingParams(max_tokens=4)))
    e.step()
    out.clear()
    e.handle(p.Reregister())
    assert not (e.queue or e.active) and not any(isinstance(m, p.Done) for m in out)


# ------------------------------------------------------------ the client
def test_the_client_forgets_failed_requests_and_late_mail_for_them() -> None:
    router = RouterSocket("inproc://fake-router")

    def answer() -> None:
        identity, msg = router.recv()
        router.send(identity, p.Error(p.BAD_REQUEST, "no", msg.request_id))
        router.send(identity, p.TokenDelta(msg.request_id, [1], "late"))
        identity, _ = router.recv()  # the status query
        router.send(identity, p.StatusReply("x", []))

    t = threading.Thread(target=answer, daemon=True)
    t.start()
    with Client("inproc://fake-router", connect_timeout_s=5) as c:
        with pytest.raises(BadRequest):
            c.generate(tokens=[1], request_id="gone")
        c.status()
        assert "gone" not in c._mail and not c._open
        with pytest.raises(BadRequest, match="at most"):
            c.generate(tokens=list(range(3_000_000)))
    t.join(5)
    router.close()


def test_binding_other_hosts_without_keys_warns(caplog: pytest.LogCaptureFixture) -> None:
    from tandem.common.auth import RouterGuard
    from tandem.common.settings import Addresses

    guard = RouterGuard.start(None, Addresses("tcp://127.0.0.1:1", "tcp://0.0.0.0:2"))
    sock = zmq.Context.instance().socket(zmq.ROUTER)
    guard.setup("workers")(sock)  # a ZAP domain (the cap per address), no CURVE
    assert not sock.curve_server and sock.zap_domain.startswith(b"workers.")
    sock.close()
    guard.stop()
    (warning,) = [r for r in caplog.records if "WITHOUT authentication" in r.message]
    assert "0.0.0.0:2" in warning.message


def test_worker_frames_waiting_in_the_socket_are_read_before_anything_expires(
    h: Harness,
) -> None:
    h.add_worker("a", FAST)
    h.add_worker("b", FAST)
    for w in h.core.workers.values():
        w.last_seen -= 100.0  # as if a long loop turn had kept the router away
    cache = p.CacheReport(full=True, seq=1)
    h.workers["a"].send(p.Heartbeat("a", 1, [], [], 0, 8192, cache))
    assert h.router.worker_sock.sock.poll(1000)
    h.router.turn()
    assert sorted(h.core.workers) == ["a"]  # a's waiting heartbeat counted; b was silent


@pytest.mark.parametrize("use_async", [False, True])
def test_a_closed_connection_fails_open_requests_at_once(tmp_path: Path, use_async: bool) -> None:
    import asyncio

    from tandem.client import AsyncClient, RouterLost

    address = f"ipc://{tmp_path}/r.sock"
    router = RouterSocket(address)

    def accept_then_die() -> None:
        identity, msg = router.recv()
        router.send(identity, p.Accepted(msg.request_id, "w", 1))
        router.close()  # the router process going away, as the client sees it

    t = threading.Thread(target=accept_then_die, daemon=True)
    t.start()
    if use_async:

        async def go() -> None:
            async with AsyncClient(address, timeout_s=20) as c:
                await c.generate(tokens=[1], max_tokens=4)

        with pytest.raises(RouterLost):
            asyncio.run(go())
    else:
        with Client(address, timeout_s=20) as c, pytest.raises(RouterLost):
            c.generate(tokens=[1], max_tokens=4)
    t.join(5)


def test_a_request_pinned_to_a_lost_worker_fails_worker_lost(h: Harness) -> None:
    pinned_to_a(h)
    h.workers["a"].send(p.Goodbye("a"))
    h.pump()
    err = h.recv(h.client)
    assert isinstance(err, p.Error) and (err.code, err.request_id) == (p.WORKER_LOST, "r1")


def test_token_frames_out_of_bounds_are_still_named() -> None:
    from tandem.common.validation import MAX_TOKEN_ID

    assert p.check(p.TokenDelta("r", [1, 2], "ab")) is None
    for bad, needle in (
        (p.TokenDelta("r", [1, -1], "ab"), "token_ids[1]"),
        (p.TokenDelta("r", [MAX_TOKEN_ID + 1], ""), "token_ids[0]"),
        (p.TokenDelta("", [1], ""), "request_id"),
        (p.Done("r\n", p.FinishReason.EOS), "request_id"),  # a token frame's id: length only
    ):
        problem = p.check(bad)
        assert problem is not None and needle == problem.field, (bad, problem)
