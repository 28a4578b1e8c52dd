"""The router's hot path: token deltas coalesced per drain, the tokenizer spec sent
once, and cached views equal to views built from scratch.

Routers run in-process on inproc:// sockets, pumped by hand (tests.helpers.Harness).
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import msgpack
import pytest

from tandem.broker.ledger import PromptBlocks
from tandem.common import blocks
from tandem.common import protocol as p
from tandem.common.blocks import PrefixChain, block_hashes, matched_tokens
from tandem.common.transport import DealerSocket
from tests.helpers import Harness
from tests.replay_links import CoreLink
from tests.unit.test_decision_replay import PREFIXES, Session

RATES = (100.0, [50.0, 80.0])


def _client_msgs(h: Harness) -> list[p.Message]:
    out = []
    while h.client.poll(100):
        msg = h.client.recv()
        assert not isinstance(msg, p.ProtocolError)
        out.append(msg)
    return out


# ------------------------------------------------------------ token frames
def _two_requests_on_a(h: Harness) -> tuple[str, str]:
    """Worker "a" registered with r1 and r2 assigned to it: their worker-side ids."""
    h.add_worker("a", RATES)
    h.submit("r1", list(range(1, 40)))
    h.submit("r2", list(range(2, 40)))
    return h.assigned("a").request_id, h.assigned("a").request_id


def test_deltas_waiting_together_reach_the_client_as_one_frame_before_done(h: Harness) -> None:
    wid1, wid2 = _two_requests_on_a(h)
    sock = h.workers["a"]
    for i in range(3):  # queued before the router drains: one drain sees all of them
        sock.send(p.TokenDelta(wid1, [10 + i], f"<{i}>"))
        sock.send(p.TokenDelta(wid2, [20 + i], f"[{i}]"))
    sock.send(p.Done(wid1, p.FinishReason.LENGTH, p.DoneStats(output_tokens=3)))
    h.pump()
    msgs = _client_msgs(h)
    kinds = [(type(m).__name__, m.request_id) for m in msgs]
    assert kinds == [("TokenDelta", "r1"), ("Done", "r1"), ("TokenDelta", "r2")]
    assert (msgs[0].token_ids, msgs[0].text) == ([10, 11, 12], "<0><1><2>")
    assert (msgs[2].token_ids, msgs[2].text) == ([20, 21, 22], "[0][1][2]")


def test_a_lone_delta_is_relayed_in_the_same_drain(h: Harness) -> None:
    h.add_worker("a", RATES)
    h.submit("r1", list(range(1, 40)))
    wid = h.assigned("a").request_id
    for i in range(3):  # one at a time: each drain relays what it read, nothing waits
        h.workers["a"].send(p.TokenDelta(wid, [i], str(i)))
        h.router.drain_workers()
        (msg,) = _client_msgs(h)
        assert isinstance(msg, p.TokenDelta) and msg.token_ids == [i]


def test_a_step_tokens_frame_reaches_each_client_as_its_own_deltas(h: Harness) -> None:
    wid1, wid2 = _two_requests_on_a(h)
    sock = h.workers["a"]
    sock.send(p.StepTokens([wid1, wid2], [[10], [20]], ["<0>", "[0]"]))
    sock.send(p.StepTokens([wid2, wid1], [[21], [11]], ["[1]", "<1>"]))
    h.pump()
    got = {m.request_id: (m.token_ids, m.text) for m in _client_msgs(h)}
    assert got == {"r1": ([10, 11], "<0><1>"), "r2": ([20, 21], "[0][1]")}


def test_a_malformed_step_tokens_frame_is_refused_and_relays_nothing(h: Harness) -> None:
    h.add_worker("a", RATES)
    h.submit("r1", list(range(1, 40)))
    wid = h.assigned("a").request_id
    sock = h.workers["a"]
    sock.send(p.StepTokens([wid, wid], [[10]], ["x", "y"]))  # two ids, one token list
    sock.send(p.StepTokens([wid], [[-5]], ["x"]))  # a negative token id
    h.pump()
    errors = [h.recv(sock), h.recv(sock)]
    assert all(isinstance(e, p.Error) and e.code == p.BAD_REQUEST for e in errors)
    assert "one of each per request" in errors[0].message and "token_ids" in errors[1].message
    assert _client_msgs(h) == []
    sock.send(p.StepTokens([wid], [[7]], ["ok"]))  # the router is still serving
    h.pump()
    (msg,) = _client_msgs(h)
    assert (msg.token_ids, msg.text) == ([7], "ok")


# ------------------------------------------------------------ tokenizer once
def _ready(h: Harness, wid: str, with_spec: bool, spec_hash: str | None = None) -> p.Ready:
    named = p.tokenizer_hash(h.spec) if spec_hash is None else spec_hash
    spec = h.spec if with_spec else {}
    return p.Ready(wid, "sim", "sim", "m.gguf", 4, 8192, 16, 100.0, [50.0], 0.5, spec,
                   tokenizer_hash=named)  # fmt: skip


def _register(h: Harness, ready: p.Ready) -> p.Message:
    sock = DealerSocket(h.router.worker_sock.address, identity=ready.worker_id.encode())
    h.workers[ready.worker_id] = sock
    sock.send(ready)
    h.pump()
    return h.recv(sock)


def test_spec_travels_only_when_the_router_lacks_it(h: Harness) -> None:
    asked = _register(h, _ready(h, "a", with_spec=False))
    assert isinstance(asked, p.Reregister) and asked.tokenizer
    h.workers["a"].send(_ready(h, "a", with_spec=True))
    h.pump()
    assert isinstance(h.recv(h.workers["a"]), p.Welcome)
    assert isinstance(_register(h, _ready(h, "b", with_spec=False)), p.Welcome)
    assert h.core.tokenizer is not None
    assert all(w.info.tokenizer == {} for w in h.core.workers.values())  # none kept per worker


def test_a_spec_that_does_not_match_its_hash_is_refused(h: Harness) -> None:
    reply = _register(h, _ready(h, "a", with_spec=True, spec_hash="0" * 32))
    assert isinstance(reply, p.Error) and "tokenizer_hash" in reply.message
    assert not h.core.workers


# ------------------------------------------------------------ cached views
def test_cached_views_equal_views_built_from_scratch(tmp_path: Path) -> None:
    link = CoreLink(tmp_path, {"calibrate": False, "decode_estimate": "ratio"})
    core = link.core
    try:
        s = Session(link, random.Random(5))
        s.start()
        rng = random.Random(6)
        for _ in range(120):
            s.step()
            tokens = rng.choice(PREFIXES)[: rng.randrange(20, 160)] + [1, 2, 3]
            blocks = PromptBlocks(tokens)
            expected = []
            for w in core.workers.values():
                fresh = core.calibration.adjust(w.view(tokens))
                cached = core.views.view(w, blocks)
                assert cached == fresh
                assert cached.backlog == fresh.replace(active=fresh.active).backlog  # summed anew
                if len(w.inflight) < w.inflight_cap and w.fits(len(tokens), 8):
                    expected.append(fresh)
            # The router's one pass: the same views, of the workers with room it fits.
            workers = core.workers.values()
            assert core.views.candidates(workers, PromptBlocks(tokens), len(tokens), 8) == expected
    finally:
        link.close()


def test_a_prefix_chain_hashes_lazily_what_block_hashes_gives() -> None:
    # Pinned: workers and routers of other versions must agree on every hash.
    assert block_hashes(list(range(1, 40)), 16) == [8892955456830702510, 2165886466295342476]
    rng = random.Random(11)
    for _ in range(300):
        tokens = [rng.randrange(50_000) for _ in range(rng.randrange(0, 200))]
        bs = rng.choice([1, 4, 16])
        full = block_hashes(tokens, bs)
        n = rng.randrange(len(full) + 1)
        chain = PrefixChain(tokens, bs, n)
        held = set(full[: rng.randrange(len(full) + 1)]) | {rng.randrange(1 << 62)}
        if full and rng.random() < 0.3:
            held.discard(rng.choice(full))
        assert chain.matched_tokens(held) == matched_tokens(full[:n], held, bs)
        assert len(chain) == n and list(chain) == full[:n] and chain[:] == full[:n]
        assert list(PrefixChain(tokens, bs, n)) == full[:n]  # again: digests looked up


def test_a_prefix_chain_answers_many_held_sets_in_turn_as_a_walk_would() -> None:
    """matched_tokens tries its last answer first: right for each set whatever the
    order (sets holding the same prefix, longer and shorter ones, holes, none)."""
    rng = random.Random(12)
    for _ in range(100):
        tokens = [rng.randrange(50_000) for _ in range(rng.randrange(16, 400))]
        bs = rng.choice([4, 16])
        full = block_hashes(tokens, bs)
        chain = PrefixChain(tokens, bs, rng.randrange(len(full) + 1))
        for _ in range(12):
            held: set[int] | frozenset[int] = set(full[: rng.randrange(len(full) + 1)])
            if rng.random() < 0.3:
                held = frozenset(held)
            elif held and rng.random() < 0.3:
                held.discard(rng.choice(full))  # a hole: the match stops before it
            for _ in range(rng.randrange(1, 3)):  # asked twice: the guess is confirmed
                assert chain.matched_tokens(held) == matched_tokens(chain[:], held, bs)


def test_a_prefix_chain_hashes_alike_when_its_digest_memo_overflows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(blocks, "_SEEN", {})
    monkeypatch.setattr(blocks, "_SEEN_MAX", 3)
    tokens = list(range(1, 200))
    for n in (2, 12, 5, 12):
        assert list(PrefixChain(tokens, 16, n)) == block_hashes(tokens, 16)[:n]
        assert len(blocks._SEEN) <= 3


# ------------------------------------------------------------ pending queue
def test_the_pending_queue_keeps_its_keys_and_units_as_it_changes() -> None:
    from tandem.broker.admission import prompt_units
    from tandem.broker.requests import ClientRequest, PendingQueue

    rng = random.Random(3)
    q = PendingQueue(prompt_units)
    for _ in range(400):
        op = rng.choice(["append", "appendleft", "popleft", "remove", "extendleft"])
        sub = p.Submit(f"r{rng.randrange(30)}", tokens=[1] * rng.randrange(1, 50))
        req = ClientRequest(rng.choice([b"a", b"b"]), sub, 0.0)
        if op in ("append", "appendleft"):
            getattr(q, op)(req)
        elif op == "extendleft":
            q.extendleft([req, ClientRequest(b"c", sub, 0.0)])
        elif q and op == "popleft":
            q.popleft()
        elif q:
            q.remove(rng.choice(list(q)))
        keys = {(r.client, r.submit.request_id) for r in q}
        assert set(q.keys) == keys and all((k in q) for k in keys)
        assert q.units == sum(prompt_units(r.submit) for r in q)


# ------------------------------------------------------------ repeated heartbeats
def test_a_repeated_heartbeat_only_says_the_worker_is_alive(h: Harness) -> None:
    h.add_worker("a", RATES)
    w = h.core.workers["a"]
    hb = p.Heartbeat("a", 3, [], [], 0, 8192, {"full": True, "seq": 1, "blocks": [11, 12]})
    h.workers["a"].send(hb)
    h.pump()
    version, seen = w.version, w.last_seen
    assert w.cache.held == {11, 12}
    h.workers["a"].send(hb)  # byte for byte the last one: not decoded, not applied
    h.pump()
    assert w.version == version and w.last_seen > seen
    changed = p.Heartbeat("a", 4, [], [], 0, 8192, {"full": True, "seq": 2, "blocks": [11]})
    h.workers["a"].send(changed)
    h.pump()
    assert w.version > version and w.cache.held == {11}
    h.workers["a"].send(p.Goodbye("a"))  # gone: its last frame is forgotten with it
    h.pump()
    assert b"a" not in h.core._hb_frames


def test_a_forced_policy_waits_for_its_full_worker_rather_than_use_another(
    tmp_path: Path,
) -> None:
    """`--policy forced:a` with a's in-flight cap reached and b free: the request waits
    for a (a lone candidate is chosen unscored only by policies that take any worker)."""
    from tandem.broker.admission import AdmissionConfig

    h = Harness(tmp_path, policy="forced:a", admission=AdmissionConfig(queue_per_slot=0))
    try:
        h.add_worker("a", (100.0, [50.0]), max_active=1)
        h.add_worker("b", (100.0, [50.0]), max_active=1)
        h.submit("r1", list(range(1, 40)))
        first = h.assigned("a")
        r2 = list(range(2, 40))
        h.client.send(p.Submit("r2", tokens=r2, sampling=p.SamplingParams(8)))
        h.pump()  # held: a is full, and b is not a's
        assert not h.workers["b"].poll(200) and not h.workers["a"].poll(50)
        assert not h.client.poll(50)  # neither accepted elsewhere nor failed
        h.workers["a"].send(
            p.Done(first.request_id, p.FinishReason.LENGTH, p.DoneStats(output_tokens=1))
        )
        h.pump()
        assert h.assigned("a").tokens == r2
        accepted = [m for m in _client_msgs(h) if isinstance(m, p.Accepted)]
        assert [(m.request_id, m.worker_id) for m in accepted] == [("r2", "a")]
        assert not h.workers["b"].poll(50)
    finally:
        h.close()


# ------------------------------------------------------------ one frame per peer per pass
def _raw_frames(sock: DealerSocket) -> list[list[p.Message | p.ProtocolError]]:
    """What arrived on ``sock``, frame by frame (DealerSocket.recv hides batches)."""
    out = []
    while sock.sock.poll(100):
        out.append(p.decode_all(sock.sock.recv()))
    return out


def test_what_one_pass_owes_a_peer_leaves_in_one_frame(h: Harness) -> None:
    h.add_worker("a", RATES)
    for i in range(3):
        h.client.send(p.Submit(f"r{i}", tokens=[1, 2, 3 + i], sampling=p.SamplingParams(4)))
    h.pump()
    (assigns,) = _raw_frames(h.workers["a"])  # three routes, one frame to the worker
    assert [type(m) for m in assigns] == [p.Assign] * 3
    (accepts,) = _raw_frames(h.client)  # and one to the client
    assert [(type(m), m.request_id) for m in accepts] == [(p.Accepted, f"r{i}") for i in range(3)]
    wids = [m.request_id for m in assigns]
    sock = h.workers["a"]
    sock.send(p.StepTokens(wids, [[5], [6], [7]], ["a", "b", "c"]))
    for wid in wids[:2]:
        sock.send(p.Done(wid, p.FinishReason.LENGTH, p.DoneStats(output_tokens=1)))
    h.pump()
    (frame,) = _raw_frames(h.client)  # tokens and Dones read in one drain: one frame
    kinds = [(type(m).__name__, m.request_id) for m in frame]
    assert kinds == [("TokenDelta", "r0"), ("Done", "r0"), ("TokenDelta", "r1"),
                     ("Done", "r1"), ("TokenDelta", "r2")]  # fmt: skip
    sock.send(p.TokenDelta(wids[2], [8], "d"))  # a lone message: a frame of its own
    h.router.drain_workers()
    assert h.client.sock.poll(1000)
    assert p.decode(h.client.sock.recv()) == p.TokenDelta("r2", [8], "d")


def test_a_batch_past_the_size_bound_is_split_in_order(h: Harness) -> None:
    from tandem.common import transport

    big = "x" * (transport.BATCH_BYTES // 3 - 64)  # three to a frame
    msgs = [p.TokenDelta(f"r{i}", [i], big) for i in range(7)]
    for m in msgs:
        h.router.client_sock.queue(b"nobody", m)  # an unknown peer: nothing is sent
    ((who, lost),) = h.router.client_sock.flush()
    assert who == b"nobody" and lost == msgs
    sock = DealerSocket(h.router.client_sock.address, identity=b"peer")
    sock.send(p.Hello())
    h.router.drain_clients()
    assert isinstance(h.recv(sock), p.Welcome)
    for m in msgs:
        h.router.client_sock.queue(b"peer", m)
    assert h.router.client_sock.flush() == []
    frames = _raw_frames(sock)
    assert len(frames) == 3 and [m for f in frames for m in f] == msgs
    sock.close()


def test_assigns_that_cannot_leave_put_their_requests_back_in_the_queue(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    h.add_worker("a", RATES)
    h.workers.pop("a").close()  # gone, and the router has not noticed yet
    for _ in range(50):  # until the router's socket has taken the pipe down
        time.sleep(0.01)
        h.router.drain_workers()
        if not h.router.worker_sock.send(b"a", p.ResyncCache()):
            break
    h.client.send(p.Submit("r1", tokens=[1, 2, 3], sampling=p.SamplingParams(4)))
    h.pump()
    assert "a" not in h.core.workers and "unreachable" in caplog.text
    assert [r.submit.request_id for r in h.core.pending] == ["r1"]
    assert not h.core.requests and not h.core.pending[0].lost_on  # not a reroute
    h.add_worker("b", RATES)
    assert h.assigned("b").tokens == [1, 2, 3]
    accepted = [m for m in _client_msgs(h) if isinstance(m, p.Accepted)]
    assert [(m.request_id, m.worker_id) for m in accepted] == [("r1", "b")]  # once, for b


def test_a_client_that_left_has_its_requests_cancelled_at_the_worker(h: Harness) -> None:
    h.add_worker("a", RATES)
    h.submit("r1", list(range(1, 40)))
    wid = h.assigned("a").request_id
    h.client.close()
    for i in range(50):  # its frames fail once the router's socket took the pipe down
        time.sleep(0.01)
        h.workers["a"].send(p.TokenDelta(wid, [i], "x"))
        h.pump()
        if not h.core.requests:
            break
    assert not h.core.requests
    assert h.recv(h.workers["a"]) == p.Cancel(wid)
    h.client = DealerSocket(h.router.client_sock.address)  # for the harness's close


def test_a_client_may_not_send_a_batch(h: Harness) -> None:
    h.add_worker("a", RATES)
    h.client.sock.send(p.encode_batch([p.Submit("r1", tokens=[1, 2, 3])]))
    h.pump()
    (reply,) = _client_msgs(h)
    assert isinstance(reply, p.Error) and reply.code == p.BAD_REQUEST and "batch" in reply.message
    assert not h.core.requests and not h.core.pending
    h.submit("r2", [1, 2, 3])  # still serving


def test_a_worker_batch_is_handled_entry_by_entry_and_a_bad_entry_refused(h: Harness) -> None:
    wid1, wid2 = _two_requests_on_a(h)
    sock = h.workers["a"]
    done = p.Done(wid1, p.FinishReason.LENGTH, p.DoneStats(output_tokens=1))
    bad = {"type": "tokens", "request_id": wid2, "token_ids": [-3], "text": ""}
    step = p.StepTokens([wid1, wid2], [[10], [20]], ["a", "b"])
    later = p.TokenDelta(wid2, [21], "c")
    entries = [p.batch_entry(step), p.batch_entry(done), msgpack.packb(bad), p.batch_entry(later)]
    sock.sock.send(p.join_batch(entries))
    h.pump()
    err = h.recv(sock)  # the bad entry, answered with its id; the rest relayed in order
    assert isinstance(err, p.Error) and err.request_id == wid2 and "token_ids" in err.message
    got = [(type(m).__name__, m.request_id) for m in _client_msgs(h)]
    assert got == [("TokenDelta", "r1"), ("Done", "r1"), ("TokenDelta", "r2")]
    assert h.core.requests[wid2].output_ids == [20, 21]


def test_tokens_for_another_workers_request_or_an_unknown_one_are_not_relayed(
    h: Harness,
) -> None:
    wid1, wid2 = _two_requests_on_a(h)
    h.add_worker("b", RATES)
    h.workers["b"].send(p.StepTokens([wid1, "nobody"], [[66], [67]], ["b?", "?"]))
    h.workers["a"].send(p.StepTokens([wid2, "gone", wid1], [[20], [21], [10]], ["x", "y", "z"]))
    h.pump()
    got = {m.request_id: (m.token_ids, m.text) for m in _client_msgs(h)}
    assert got == {"r1": ([10], "z"), "r2": ([20], "x")}
    assert h.core.requests[wid1].output_ids == [10]
    assert h.core.metrics.totals["tokens_relayed"] == 2


def test_a_bug_on_one_batch_entry_does_not_lose_the_others(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    wid1, wid2 = _two_requests_on_a(h)
    relay = h.core.relay

    def flaky(w, msg, now):  # noqa: ANN001, ANN202 - the core's own signature
        if msg.request_id == wid1:
            raise RuntimeError("a bug")
        return relay(w, msg, now)

    monkeypatch.setattr(h.core, "relay", flaky)
    done = [
        p.Done(wid, p.FinishReason.LENGTH, p.DoneStats(output_tokens=0)) for wid in (wid1, wid2)
    ]
    h.workers["a"].sock.send(p.encode_batch(done))
    h.pump()
    assert [(type(m), m.request_id) for m in _client_msgs(h)] == [(p.Done, "r2")]


def test_an_accepted_waits_briefly_to_leave_with_the_first_output(tmp_path: Path) -> None:
    h = Harness(tmp_path, accept_hold_ms=200.0)
    try:
        h.add_worker("a", RATES)
        h.client.send(p.Submit("fast", tokens=[1, 2, 3], sampling=p.SamplingParams(1)))
        h.pump()
        wid = h.assigned("a").request_id
        assert not h.client.sock.poll(50)  # held: the output may come with it
        done = p.Done(wid, p.FinishReason.LENGTH, p.DoneStats(output_tokens=1))
        h.workers["a"].sock.send(p.encode_batch([p.TokenDelta(wid, [7], "x"), done]))
        h.pump()
        (frame,) = _raw_frames(h.client)  # one frame: Accepted, the token, the Done
        assert [type(m) for m in frame] == [p.Accepted, p.TokenDelta, p.Done]
        h.client.send(p.Submit("slow", tokens=[1, 2, 3], sampling=p.SamplingParams(1)))
        h.pump()
        assert not h.client.sock.poll(50)
        time.sleep(0.2)  # no output within the hold: it goes alone
        h.router.turn()
        (frame,) = _raw_frames(h.client)
        assert [(type(m), m.request_id) for m in frame] == [(p.Accepted, "slow")]
        assert h.router._poll_ms() == 100  # nothing held: the loop's usual wait
    finally:
        h.close()


def test_a_lone_worker_with_room_is_chosen_without_building_its_view(tmp_path: Path) -> None:
    """One worker with room that the request fits: the router places it there with no
    view of it (a view copies its whole ledger); with two, or one it does not fit, the
    candidates' path decides, and both paths name the same worker."""
    h = Harness(tmp_path, policy="finish_time", decision_log=None)
    try:
        h.add_worker("a", RATES)
        h.add_worker("b", RATES)
        a, b = h.core.workers["a"], h.core.workers["b"]
        views, workers = h.core.views, h.core.workers.values()

        def lone(prompt: int) -> object:
            views.refresh(workers)
            return views.sole(prompt, 8)

        assert lone(40) is None  # both have room: a choice to make
        b.inflight_cap, b.version = 0, b.version + 1  # b is full
        assert lone(40) is a
        assert lone(9000) is None  # it does not fit the one with room
        for i in range(3):
            h.submit(f"r{i}", list(range(1, 40)))
            h.assigned("a")
        assert a.view_entry is None and b.view_entry is None  # no view was ever built
        (chosen,) = views.candidates(workers, PromptBlocks(list(range(1, 40))), 39, 8)
        assert chosen.id == "a" and chosen.n_requests == 3
        routed = h.core.metrics.recent[-1]
        assert routed[2:5] == ("a", "finish_time", 1)  # worker, policy, candidates
        b.inflight_cap, b.version = 100, b.version + 1
        assert lone(40) is None
        h.submit("r3", list(range(1, 40)))  # both have room: b (idle) finishes it first
        h.assigned("b")
        assert h.core.metrics.recent[-1][2:5] == ("b", "finish_time", 2)
    finally:
        h.close()


def test_a_request_only_some_workers_fit_is_offered_to_those(h: Harness) -> None:
    """The candidates' fast path skips the per-worker fit when the request fits the
    smallest worker; past it each worker answers by WorkerState.fits."""
    spec = _ready(h, "big", with_spec=True)
    assert isinstance(_register(h, spec), p.Welcome)
    small = p.replace(spec, worker_id="small", n_ctx=256, max_tokens_limit=64)
    assert isinstance(_register(h, small), p.Welcome)
    workers = h.core.workers.values()

    def offered(prompt: int, budget: int) -> set[str]:
        tokens = list(range(1, prompt + 1))
        views = h.core.views.candidates(workers, PromptBlocks(tokens), prompt, budget)
        return {v.id for v in views}

    assert offered(100, 32) == {"big", "small"}  # fits both: the fast path
    assert offered(300, 32) == {"big"}  # past the small one's context
    assert offered(100, 100) == {"big"}  # past its max_tokens_limit
    assert offered(9000, 32) == set()  # fits no one
