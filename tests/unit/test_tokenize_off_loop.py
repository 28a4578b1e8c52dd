"""Large prompts are tokenized beside the router's loop (broker/tokenize.py): a small
request behind a large one is routed first, a cancel during tokenization ends the
request at once, and a prompt that cannot be tokenized fails as it did on the loop.

The tokenizer is gated: its large encodes wait for the test's word, so what
happens while a prompt is being tokenized is decided by the test, not by timing."""

from __future__ import annotations

import select
import threading
from typing import Any

import pytest

from tandem.broker.tokenize import OFF_LOOP_CHARS
from tandem.common import protocol as p
from tests.helpers import Harness

RATES = (100.0, [50.0, 80.0])
BIG = "x" * (OFF_LOOP_CHARS + 10)  # over the threshold; the tiny vocabulary reads it as [0]


class Gated:
    """The router's tokenizer, with encodes over the threshold held until ``go``."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.go = inner, threading.Event()

    def encode(self, text: str, **kwargs: Any) -> list[int]:
        if len(text) > OFF_LOOP_CHARS:
            assert kwargs.get("release_gil"), "a large prompt was tokenized on the loop"
            assert self.go.wait(10)
        return self.inner.encode(text, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.fixture
def gated(tmp_path):
    h = Harness(tmp_path)
    h.add_worker("a", RATES)
    gate = h.core.tokenizer = Gated(h.core.tokenizer)
    yield h, gate
    gate.go.set()
    h.router.tokenizing.close()
    h.close()


def settle(h: Harness) -> None:
    """Wait for the tokenizing jobs to finish, then let the loop take them back."""
    while len(h.router.tokenizing) and not select.select([h.router.tokenizing.wake], [], [], 10)[0]:
        pass
    h.core.tokenized()
    h.pump()


def test_a_small_request_behind_a_large_one_is_routed_first(gated):
    h, gate = gated
    h.client.send(p.Submit("big", prompt=BIG, sampling=p.SamplingParams(4)))
    h.client.send(p.Submit("small", prompt="t2", sampling=p.SamplingParams(4)))
    h.pump()
    assert h.assigned("a").tokens == [2]  # while "big" is still being tokenized
    assert "big" in {r.submit.request_id for r, _ in h.router.tokenizing._jobs.values()}
    gate.go.set()
    settle(h)
    assert h.assigned("a").tokens == [0]
    accepted = [h.recv(h.client), h.recv(h.client)]
    assert [m.request_id for m in accepted] == ["small", "big"]


def test_a_cancel_during_tokenization_ends_the_request_and_its_tokens_are_dropped(gated):
    h, gate = gated
    h.client.send(p.Submit("big", prompt=BIG, sampling=p.SamplingParams(4)))
    h.pump()
    h.client.send(p.Cancel("big"))
    h.pump()
    done = h.recv(h.client)
    assert isinstance(done, p.Done) and done.finish_reason == p.FinishReason.CANCELLED
    gate.go.set()
    settle(h)
    assert not h.workers["a"].poll(200), "a cancelled request was assigned"
    assert not h.core.pending and not h.core.requests
    # The id is free again: the same request can be sent anew.
    h.client.send(p.Submit("big", prompt="t3", sampling=p.SamplingParams(4)))
    h.pump()
    assert h.assigned("a").tokens == [3]


def test_a_duplicate_of_a_request_being_tokenized_is_refused(gated):
    h, _ = gated
    h.client.send(p.Submit("big", prompt=BIG, sampling=p.SamplingParams(4)))
    h.pump()
    h.client.send(p.Submit("big", prompt="t1", sampling=p.SamplingParams(4)))
    h.pump()
    err = h.recv(h.client)
    assert isinstance(err, p.Error) and err.code == p.DUPLICATE_REQUEST


def test_a_large_chat_that_cannot_be_formatted_fails_as_on_the_loop(gated):
    h, gate = gated
    gate.go.set()
    messages = [{"role": "user", "content": "x" * (OFF_LOOP_CHARS + 1)}]
    h.client.send(p.Submit("chat", messages=messages, sampling=p.SamplingParams(4)))
    h.pump()
    settle(h)
    err = h.recv(h.client)
    assert isinstance(err, p.Error) and err.code == p.BAD_REQUEST and err.request_id == "chat"


def test_the_serving_loop_wakes_for_a_finished_prompt(tmp_path):
    """Through ``serve``, not pumped by hand: the loop polls the jobs' wake-up
    with its sockets and routes the request when its tokens are ready."""
    h = Harness(tmp_path)
    h.add_worker("a", RATES)
    stop = threading.Event()
    loop = threading.Thread(target=h.router.serve, args=(stop,), daemon=True)
    loop.start()
    try:
        h.client.send(p.Submit("big", prompt=BIG, sampling=p.SamplingParams(4)))
        assert h.workers["a"].poll(10_000), "the tokenized request was never routed"
        assert h.assigned("a").tokens == [0]
    finally:
        stop.set()
        loop.join(5)
    h.close()


def test_a_prompt_longer_than_every_context_is_refused_untokenized(gated):
    """A prompt whose characters alone are more tokens than any worker's context
    (8192 here) fails at once, and no thread spends time tokenizing it."""
    h, gate = gated
    gate.fewest_tokens = lambda text: len(text) // 4  # as if no entry were over 4 chars
    h.client.send(p.Submit("huge", prompt="x" * (4 * 8190), sampling=p.SamplingParams(4)))
    h.client.send(p.Submit("fits", prompt="x" * (4 * 8187), sampling=p.SamplingParams(4)))
    h.pump()
    err = h.recv(h.client)
    assert isinstance(err, p.Error) and err.code == p.PROMPT_TOO_LONG
    assert err.request_id == "huge" and "at least 8190 tokens" in err.message
    jobs = {r.submit.request_id for r, _ in h.router.tokenizing._jobs.values()}
    assert jobs == {"fits"}  # the one that may fit is tokenized as before
