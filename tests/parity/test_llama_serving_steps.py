"""The llama.cpp worker's engine on the embedded model: min_tokens holds back the
end of generation; ignore_eos streams the special tokens it counts; a burst sharing
a prefix computes it once; a long prompt beside a decoding stream is cut into
time-budgeted chunks (counted in steps, not seconds)."""

from __future__ import annotations

from typing import Any

import pytest

from tandem.common import protocol as p
from tandem.common.model_files import default_model_path
from tandem.common.protocol import SamplingParams
from tandem.common.tokenizer import TextTokenizer, tokenizer_spec_from_gguf
from tandem.workers.engine import Engine, EngineConfig
from tandem.workers.request import Request
from tests.helpers import needs_llama

pytestmark = [pytest.mark.model, needs_llama]
STEP = 256
CHAT = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
LLAMA_BACKEND = {"n_ctx": 4096, "cache_entries": 4, "step_tokens": STEP}  # conftest's backend


@pytest.fixture(scope="module")
def tok() -> TextTokenizer:
    return TextTokenizer(tokenizer_spec_from_gguf(default_model_path()))


class Recorder:
    """The backend, each step noted: (decode request ids, prompt tokens, chunk budget)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.steps: list[tuple[list[str], int, int | None]] = []
        self.cap: int | None = None  # the chunk budget of the step being planned

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def run(self, decode, prefill):
        self.steps.append(([r.id for r in decode], sum(n for _, n in prefill), self.cap))
        self.cap = None
        return self.inner.run(decode, prefill)


def engine(backend: Any, **kw: Any) -> tuple[Engine, list[p.Message]]:
    out: list[p.Message] = []
    cfg = EngineConfig(max_active=4, step_tokens=STEP, cache_tokens=0, **kw)
    return Engine(backend, cfg, out.append, "t"), out


def drain(e: Engine) -> None:
    while e.queue or e.active:
        e.step()


def done(out: list[p.Message]) -> dict[str, p.Done]:
    return {m.request_id: m for m in out if isinstance(m, p.Done)}


def test_min_tokens_holds_back_the_end_of_generation(backend, tok):
    prompt = tok.encode(CHAT.format("Say yes."))
    e, out = engine(backend)
    e.submit(Request("free", prompt, SamplingParams(max_tokens=64)))
    drain(e)
    natural = done(out)["free"]
    assert natural.finish_reason is p.FinishReason.EOS  # the model ends early on its own
    n = natural.stats.output_tokens
    e.submit(Request("held", prompt, SamplingParams(max_tokens=64, min_tokens=n + 10)))
    drain(e)
    held = done(out)["held"]
    assert held.stats.output_tokens >= n + 10
    ids = [t for m in out if isinstance(m, p.TokenDelta) and m.request_id == "held"
           for t in m.token_ids]  # fmt: skip
    assert not any(backend.is_eog(t) for t in ids)  # masked, not generated through


def test_ignore_eos_streams_the_text_of_every_token_it_counts(backend, tok):
    """Past its natural end the model emits special tokens (<|im_end|>, <|im_start|>):
    they are streamed as their text, so the usage counts what the text says."""
    e, out = engine(backend)
    prompt = tok.encode(CHAT.format("Say yes."))
    e.submit(Request("on", prompt, SamplingParams(48, ignore_eos=True)))
    drain(e)
    deltas = [m for m in out if isinstance(m, p.TokenDelta)]
    ids = [t for m in deltas for t in m.token_ids]
    text = "".join(m.text for m in deltas)
    assert done(out)["on"].stats.output_tokens == len(ids) == 48
    specials = [t for t in ids if backend.is_eog(t)]
    assert specials, "expected the model to emit an end-of-generation token it was told to ignore"
    assert text == tok.decode(ids)  # the whole text, special tokens included
    assert text.count("<|im_end|>") == ids.count(tok.encode("<|im_end|>")[0])
    assert len(tok.encode(text)) == len(ids)  # re-tokenized, the text gives the count back


def test_a_burst_sharing_a_prefix_computes_it_once(backend, tok):
    shared = tok.encode("You are a careful assistant. " * 40)  # ~240 tokens, one system text
    e, out = engine(backend)
    for i, q in enumerate(["Name a colour.", "Name a fruit.", "Name a city."]):
        e.submit(Request(f"b{i}", shared + tok.encode(CHAT.format(q)), SamplingParams(8)))
    drain(e)
    cached = [done(out)[f"b{i}"].stats.cached_tokens for i in range(3)]
    aligned = len(shared) // 16 * 16
    assert cached[0] == 0
    assert min(cached[1:]) >= aligned - 16  # the shared blocks, computed by b0 alone


def test_a_decoding_stream_waits_one_budgeted_step_per_token(backend, tok):
    rec = Recorder(backend)
    e, out = engine(rec, step_budget_x=3.0, min_chunk_tokens=16)
    budget = e.timer.chunk_cap

    def noted(*args: Any) -> int:  # the budget the engine planned this step with
        rec.cap = budget(*args)
        return rec.cap

    e.timer.chunk_cap = noted  # type: ignore[method-assign]
    e.submit(Request("warm", tok.encode("word " * 300), SamplingParams(4, ignore_eos=True)))
    drain(e)  # prefill chunk rates measured
    e.submit(Request("d", tok.encode(CHAT.format("Count to fifty.")),
                     SamplingParams(200, ignore_eos=True)))  # fmt: skip
    for _ in range(20):  # decode steps measured
        e.step()
    start = len(rec.steps)
    e.submit(Request("long", tok.encode("story " * 700), SamplingParams(2, ignore_eos=True)))
    while any(r.id == "long" for r in [*e.queue, *e.active]) and "d" in {r.id for r in e.active}:
        e.step()
    beside = [(n, cap) for ids, n, cap in rec.steps[start:] if "d" in ids and n]
    assert len(beside) > 700 // STEP + 1  # cut finer than the token budget would
    # each step the stream was in gave it a token (it is a decode row) and took at most
    # the time budget's chunk: the stream waited one such step per token
    assert all(cap is not None and n <= cap for n, cap in beside)
    assert max(n for n, _ in beside) < STEP - 1
