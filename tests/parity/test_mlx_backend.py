"""The MLX backend through the engine: batching, sampling, prefix cache, slots, parity.

Most tests use a tiny random float32 llama (fast). Its head is untied: a tied
random head mostly predicts the token it was just fed, which would hide position
and KV errors; an untied one gives sequences that depend on the whole context.
The last tests run the real model in real worker processes (slow on a CPU).
"""

from __future__ import annotations

import random
import threading

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")

from mlx_lm.models import llama  # noqa: E402

from tandem.common import protocol as p  # noqa: E402
from tandem.common.protocol import SamplingParams  # noqa: E402
from tandem.common.tokenizer import TextTokenizer  # noqa: E402
from tandem.workers.backends.mlx.backend import MlxBackend, pick_device  # noqa: E402
from tandem.workers.backends.mlx.model import make_tiny_model  # noqa: E402
from tandem.workers.engine import Engine, EngineConfig, KVFull  # noqa: E402
from tandem.workers.prefix_cache import Match  # noqa: E402
from tandem.workers.request import Request  # noqa: E402

pytestmark = pytest.mark.mlx

LENGTHS = (5, 17, 40, 90)


@pytest.fixture(scope="module")
def tiny():
    """(model, spec, config): the tiny llama with an untied random head."""
    _, spec, config = make_tiny_model(seed=1)
    config = {**config, "tie_word_embeddings": False}
    mx.random.seed(0)
    model = llama.Model(llama.ModelArgs.from_dict(config))
    mx.eval(model.parameters())
    return model, spec, config


def prompts(seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, 40000) for _ in range(n)] for n in LENGTHS]


class Harness:
    """An engine over a fresh backend, stepped by hand, its messages collected."""

    def __init__(self, tiny, n_ctx: int = 4096, **engine_kwargs) -> None:
        self.backend = MlxBackend.from_model(tiny, name="tiny", n_ctx=n_ctx, device="cpu")
        self.messages: list[p.Message] = []
        cfg = EngineConfig(**{"max_active": 4, "step_tokens": 64, **engine_kwargs})
        self.engine = Engine(self.backend, cfg, self.messages.append, "t")

    def run(self, *reqs: Request) -> dict[str, list[int]]:
        """Submit ``reqs``, step until all are done; each one's streamed tokens."""
        for r in reqs:
            self.engine.submit(r)
        while self.engine.queue or self.engine.active:
            self.engine.step()
        return self.tokens({r.id for r in reqs})

    def tokens(self, ids: set[str]) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {i: [] for i in ids}
        for m in self.messages:
            if isinstance(m, p.TokenDelta) and m.request_id in ids:
                out[m.request_id] += m.token_ids
        return out

    def done(self, request_id: str) -> p.Done:
        return next(
            m for m in self.messages if isinstance(m, p.Done) and m.request_id == request_id
        )

    def text(self, request_id: str) -> str:
        deltas = [m for m in self.messages if isinstance(m, p.TokenDelta)]
        return "".join(m.text for m in deltas if m.request_id == request_id)

    def assert_released(self) -> None:
        b = self.backend
        assert not b._slots and len(b._batch) == 0 and b._pending is None
        assert b._held_tokens == self.engine.cache.tokens_held


def greedy(rid: str, prompt: list[int], max_tokens: int, **kw) -> Request:
    return Request(rid, list(prompt), SamplingParams(max_tokens=max_tokens, ignore_eos=True, **kw))


def raw_mlx_lm_greedy(model, prompt: list[int], n: int) -> list[int]:
    """The reference: mlx-lm's own single-sequence loop."""
    from mlx_lm.generate import generate_step

    steps = generate_step(mx.array(prompt), model, max_tokens=n)
    return [int(t) for t, _ in steps]


@pytest.mark.parametrize("mask", ["boolean", "additive", "always-additive"])
def test_batched_decode_equals_each_request_alone(tiny, mask: str, monkeypatch) -> None:
    """Also with the ragged batch's mask given as 0 / -inf, and with a mask on every
    step (studies/step_gap.py's mask modes): the same tokens."""
    from tandem.workers.backends.mlx.batch import DecodeBatch

    monkeypatch.setattr(DecodeBatch, "additive_mask", mask != "boolean")
    monkeypatch.setattr(DecodeBatch, "always_mask", mask.startswith("always"))
    budgets = (12, 6, 15, 9)  # rows leave the batch at different steps
    reqs = [
        greedy(f"r{i}", pr, m) for i, (pr, m) in enumerate(zip(prompts(), budgets, strict=True))
    ]
    alone = {}
    for r in reqs:
        h = Harness(tiny)
        alone |= h.run(greedy(r.id, r.prompt, r.max_tokens))
        h.assert_released()
    h = Harness(tiny, step_tokens=48)  # the 90-token prompt prefills in chunks beside decodes
    batched = h.run(*reqs)
    for r in reqs:
        assert len(batched[r.id]) == r.max_tokens
        # float32: padding is masked to exactly zero weight and rows are independent,
        # so batching changes nothing but summation order; the tokens agree exactly.
        assert batched[r.id] == alone[r.id], r.id
        assert h.done(r.id).finish_reason == "length"
    assert len(set(map(tuple, batched.values()))) == 4
    # One pass per step for all decode rows: far fewer passes than decoded tokens.
    assert h.backend.decode_passes <= max(budgets) + len(reqs)
    h.assert_released()


def test_greedy_output_matches_a_raw_mlx_lm_loop(tiny) -> None:
    prompt = prompts()[2]
    ours = Harness(tiny).run(greedy("a", prompt, 10))["a"]
    assert ours == raw_mlx_lm_greedy(tiny[0], prompt, 10)


def test_seeded_sampling_does_not_depend_on_the_batch(tiny) -> None:
    kw = {"temperature": 0.9, "top_p": 0.95, "top_k": 200}
    alone = Harness(tiny).run(greedy("s", prompts()[1], 12, seed=7, **kw))["s"]
    others = [greedy(f"o{i}", pr, 12, seed=i, **kw) for i, pr in enumerate(prompts(1))]
    batched = Harness(tiny).run(greedy("s", prompts()[1], 12, seed=7, **kw), *others)
    assert batched["s"] == alone
    other_seed = Harness(tiny).run(greedy("s", prompts()[1], 12, seed=8, **kw))["s"]
    assert other_seed != alone
    assert alone != Harness(tiny).run(greedy("g", prompts()[1], 12))["g"]  # not greedy


def test_top_k_one_is_greedy(tiny) -> None:
    kw = {"temperature": 1.5, "top_k": 1, "seed": 3}
    sampled = Harness(tiny).run(greedy("k", prompts()[0], 8, **kw))["k"]
    assert sampled == Harness(tiny).run(greedy("g", prompts()[0], 8))["g"]


def test_a_row_joining_rolls_back_the_queued_step(tiny) -> None:
    """The engine never plans this (a join follows the step that ends a prefill,
    which queues nothing), but the backend must survive any plan."""
    b = MlxBackend.from_model(tiny, device="cpu")
    a, c = greedy("a", prompts()[0], 6), greedy("c", prompts()[2], 6)
    for r in (a, c):
        b.begin(r, Match(None, 0))

    def step(decode: list[Request], prefill: list[tuple[Request, int]]) -> None:
        out = b.run(decode, prefill)  # the engine's bookkeeping, by hand
        for r in decode:
            r.n_fed += 1
        for r, n in prefill:
            r.n_computed += n
        for r in decode + [r for r, _ in prefill]:
            r.output += [out[r.id]] if r.id in out else []

    step([], [(a, len(a.prompt))])
    step([a], [])
    assert b._pending is not None
    step([], [(c, len(c.prompt))])  # a's queued step waits
    step([a, c], [])  # c joins: a's queued step is rolled back and redone beside c
    step([a, c], [])
    assert b.speculation_dropped == 1
    for r in (a, c):
        alone = Harness(tiny).run(greedy(r.id, r.prompt, 6))[r.id]
        assert r.output == alone[: len(r.output)]
        b.free(b.end(r))
    assert not b._slots and len(b._batch) == 0 and b._held_tokens == 0


def test_prefix_cache_hit_skips_prefill_and_continues_like_a_cold_run(tiny) -> None:
    shared = prompts()[2]  # 40 tokens: two full 16-token blocks are reusable
    tail = [101, 202, 303, 404, 505, 606, 707, 808]
    cold = Harness(tiny).run(greedy("cold", shared + tail, 10))["cold"]

    h = Harness(tiny)
    h.run(greedy("seed", shared, 1))
    (entry,) = h.engine.cache.entries.values()
    cached = [k for k, _ in entry.handle.layers]  # the entry is superseded (freed) later
    snapshot = [np.array(k) for k in cached]
    fed_before = h.backend.prompt_tokens_fed
    warm = h.run(greedy("warm", shared + tail, 10))["warm"]
    assert h.done("warm").stats.cached_tokens == 32
    assert h.backend.prompt_tokens_fed - fed_before == len(shared + tail) - 32
    assert warm == cold
    # The request wrote after the shared prefix; the cached arrays did not change.
    assert all(np.array_equal(a, np.array(k)) for a, k in zip(snapshot, cached, strict=True))
    again = h.run(greedy("again", shared + tail, 10))["again"]
    assert again == cold and h.done("again").stats.cached_tokens == 32
    h.assert_released()


def test_prefill_only_seeds_the_cache(tiny) -> None:
    h = Harness(tiny)
    shared = prompts()[3]
    h.run(Request("p", shared, SamplingParams(max_tokens=1, prefill_only=True)))
    assert h.done("p").finish_reason == "prefill_only"
    fed = h.backend.prompt_tokens_fed
    h.run(greedy("q", shared + [7, 8, 9], 4))
    assert h.backend.prompt_tokens_fed - fed == len(shared) + 3 - 80
    h.assert_released()


def test_cancel_finish_and_eviction_release_everything(tiny) -> None:
    from tandem.workers.request import Status

    h = Harness(tiny, max_active=2, step_tokens=16)
    for i, pr in enumerate(prompts()):
        h.engine.submit(greedy(f"c{i}", pr, 30))
    for _ in range(3):  # c0 and c1 prefill, then both decode; c2 and c3 wait
        h.engine.step()
    assert len(h.backend._batch) == 2 and h.backend._pending is not None
    h.engine.cancel("c3")  # queued
    h.engine.cancel("c0")  # decoding, with a speculative step queued
    h.engine.cancel("c0")  # idempotent
    assert len(h.backend._batch) == 1 and h.backend._pending is not None
    h.engine.step()  # c2 admitted: its first chunk of 40 tokens
    c2 = next(r for r in h.engine.active if r.id == "c2")
    assert c2.status is Status.PREFILL and 0 < c2.n_computed < 40
    h.engine.cancel("c2")
    h.run()
    reasons = {m.request_id: m.finish_reason for m in h.messages if isinstance(m, p.Done)}
    assert reasons == {"c0": "cancelled", "c1": "length", "c2": "cancelled", "c3": "cancelled"}
    h.assert_released()
    for handle in h.engine.cache.clear():
        h.backend.free(handle)
    assert h.backend._held_tokens == 0


def test_eos_ignore_eos_and_stop_strings(tiny) -> None:
    prompt = prompts()[1]
    h = Harness(tiny)
    free_run = h.run(greedy("free", prompt, 8))["free"]
    free_text = h.text("free")
    h.backend._eog = frozenset({free_run[3]})  # pretend the 4th token ends generation
    eos = h.run(Request("eos", prompt, SamplingParams(max_tokens=8)))["eos"]
    assert eos == free_run[: free_run.index(free_run[3])]
    assert h.done("eos").finish_reason == "eos"
    ignored = h.run(greedy("ign", prompt, 8))["ign"]
    assert ignored == free_run and h.done("ign").finish_reason == "length"
    h.backend._eog = frozenset(h.backend.tokenizer_spec.eos_ids)
    stop = free_text.strip()[4:7]
    assert len(stop) == 3, free_text
    h.run(greedy("stop", prompt, 8, stop=[stop]))
    assert h.done("stop").finish_reason == "stop"
    assert stop not in h.text("stop")
    assert free_text.startswith(h.text("stop"))
    h.assert_released()


def test_kv_full_is_raised_before_any_change_and_the_engine_recovers(tiny) -> None:
    h = Harness(tiny, n_ctx=160, cache_tokens=4096)
    h.run(greedy("a", prompts()[3], 4))  # leaves ~93 tokens in the prefix cache
    b = h.backend
    req = greedy("x", prompts(5)[3], 4)
    b.begin(req, Match(None, 0))
    with pytest.raises(KVFull):
        b.run([], [(req, 90)])
    assert req.slot.n_tokens == 0 and b.prompt_tokens_fed == 90
    b.free(b.end(req))
    h.run(greedy("y", prompts(5)[3], 4))  # the engine evicts the cache entry, then runs
    assert h.done("y").finish_reason == "length"
    assert h.engine.cache.tokens_held <= 160
    h.assert_released()


def test_pieces_rebuild_multibyte_text(tiny) -> None:
    b = MlxBackend.from_model(tiny, device="cpu")
    text = "naïve café → 🙂 日本語"
    ids = TextTokenizer(b.tokenizer_spec).encode(text)
    pieces = [b.piece(t) for t in ids]
    assert b"".join(pieces) == text.encode()
    assert any(_invalid_utf8(x) for x in pieces), "expected a partial UTF-8 piece"
    im_end = TextTokenizer(b.tokenizer_spec).encode("<|im_end|>")
    assert len(im_end) == 1 and b.piece(im_end[0]) == b"<|im_end|>" and b.is_eog(im_end[0])


def _invalid_utf8(x: bytes) -> bool:
    try:
        x.decode()
    except UnicodeDecodeError:
        return True
    return False


def test_device_selection() -> None:
    assert pick_device("cpu")[1] == "cpu"
    gpu = mx.metal.is_available() or mx.cuda.is_available()
    assert pick_device("auto")[1] == ("cpu" if not gpu else pick_device("gpu")[1])
    if not gpu:
        with pytest.raises(ValueError, match="no GPU"):
            pick_device("gpu")
    with pytest.raises(ValueError, match="auto, gpu or cpu"):
        pick_device("tpu")


# --- the real model --------------------------------------------------------------------


@pytest.mark.model
def test_pieces_equal_llama_cpp_for_every_token() -> None:
    pytest.importorskip("llama_cpp")
    from tandem.common.model_files import default_model_path
    from tandem.common.tokenizer import piece_table, tokenizer_spec_from_gguf
    from tandem.workers.backends.llama import LlamaBackend

    path = default_model_path()
    ref = LlamaBackend(path, n_ctx=256, max_active=1, cache_entries=0)
    table = piece_table(tokenizer_spec_from_gguf(path), ref.vocab_size)
    assert [i for i in range(ref.vocab_size) if table[i] != ref.piece(i)] == []
    ref.close()


# ~16 tokens, so prompt + output fill a 16-token block the workers can advertise.
PARIS = "Question: which city is the capital of France? Answer: The capital of France is"


@pytest.mark.model
def test_mlx_and_llama_cpp_workers_serve_side_by_side() -> None:
    pytest.importorskip("llama_cpp")
    from tandem.launcher.cluster import Cluster, WorkerSpec
    from tests.helpers import LLAMA_ARGS, wait_for

    # No warm-up (as LLAMA_ARGS): on two busy cores the MLX warm-up alone once outlasted
    # the 120 s start budget; serving side by side is what this test is about.
    mlx_args = ["--backend", "mlx", "--device", "cpu", "--n-ctx", "1024", "--heartbeat-s", "0.2",
                "--warmup", "off"]  # fmt: skip
    workers = [WorkerSpec("mlx0", mlx_args), WorkerSpec("cpu0", LLAMA_ARGS)]
    with Cluster(workers=workers, start_timeout_s=120) as cl, cl.client(timeout_s=120) as c:
        rows = {w["id"]: w for w in c.status().workers}
        assert rows["mlx0"]["device"] == "cpu" and rows["mlx0"]["backend"] == "mlx"
        assert rows["mlx0"]["model"] == rows["cpu0"]["model"]
        results: dict[str, object] = {}

        def ask(worker: str) -> None:
            with cl.client(timeout_s=120) as ci:
                results[worker] = ci.generate(PARIS, max_tokens=8, worker=worker)

        threads = [threading.Thread(target=ask, args=(w,)) for w in ("mlx0", "cpu0")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        mlx_r, cpu_r = results["mlx0"], results["cpu0"]
        assert mlx_r.worker == "mlx0" and cpu_r.worker == "cpu0"
        print(f"\nmlx: {mlx_r.text!r} {mlx_r.stats}\nllama.cpp: {cpu_r.text!r}")
        assert "Paris" in mlx_r.text
        # Top-1 agrees at ~96 % of positions: compare the first two tokens only.
        assert mlx_r.token_ids[:2] == cpu_r.token_ids[:2]
        wait_for(c, lambda ws: all(w["cached_blocks"] > 0 for w in ws))


def test_warm_up_leaves_no_state_behind(tiny) -> None:
    from tandem.workers.profiler import warm_up

    warmed = Harness(tiny)
    warm_up(warmed.backend, max_active=4, step_tokens=64)
    warmed.assert_released()
    prompt = prompts()[3]
    assert warmed.run(greedy("a", prompt, 8)) == Harness(tiny).run(greedy("a", prompt, 8))


def test_min_tokens_masks_the_end_of_generation_until_then(tiny):
    h = Harness(tiny)
    eos = sorted(h.backend._eog)[0]
    pushed = {eos: 100.0}  # without min_tokens the first token is the end
    prompt = prompts()[0]
    h.run(Request("free", prompt, SamplingParams(max_tokens=20, logit_bias=pushed)))
    assert h.done("free").stats.output_tokens == 0
    sp = SamplingParams(max_tokens=20, logit_bias=pushed, min_tokens=5)
    got = h.run(Request("held", prompt, sp))["held"]
    assert len(got) == 5 and eos not in got  # decode passes and the prefill's token alike
    assert h.done("held").finish_reason is p.FinishReason.EOS
    h.assert_released()
