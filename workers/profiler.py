"""``tandem profile``: measure one backend in isolation, in this process, no router.

The backend is driven through the real ``Engine`` (with a collecting ``emit``),
so the numbers include the engine's own per-step overhead, as serving does:

- prefill: a cold ``prompt_tokens``-token prompt (``prefill_only``, fresh random
  ids, prefix cache disabled), median of ``repeats`` runs after one warm-up;
- decode: for every batch size b in 1..max_active, b requests with distinct
  ``decode_context``-token prompts (default: ``prompt_tokens``) decode together;
  aggregate tok/s is the tokens they produced divided by the time from the step
  where all were decoding (plus ``SKIP_STEPS``, which pay first-shape costs on a
  GPU) to the last one's end. The context matters: llama.cpp on a CPU decodes
  ~2.2x slower after 512 tokens than after 16 (measured on 2 threads, 43 vs 92
  tok/s at batch 1), and serving decodes after real prompts.
- every batch size is measured ``repeats`` (>= 3) times, in rounds over all
  batch sizes (a stall then hits one sample of one size, not all of one size's);
  the median counts. A point far off its neighbours or a dip with batch size is
  repaired with ``common.ratefit`` (one fresh GPU profile once said 11 tok/s at
  batch 2 between 180 and 332, a one-off stall); the result records the medians,
  their spread and what was repaired.

The result is stored with ``workers.profiles.save_profile`` under the backend's
name, device and model; workers started without rate flags advertise it.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from tandem.common import protocol as p
from tandem.common.protocol import SamplingParams
from tandem.common.ratefit import explain, fit_decode_rates
from tandem.common.steptime import StepStats, batch_ladder
from tandem.workers.engine import Engine, EngineBackend, EngineConfig
from tandem.workers.profiles import profile_model
from tandem.workers.request import Request, Status

_FIRST_PROMPT_ID = 256  # random prompts avoid control tokens
WARM_PROMPT_TOKENS = 16
WARMUP_CONTEXT = 512  # the profile's default decode context: measured alike, comparable
WARMUP_STEPS = 8  # decode steps measured per batch size at start (a stall counts for <= 4 steps)
SKIP_STEPS = 2  # decode steps at a new batch size left out of the timing
MIN_REPEATS = 3  # samples per batch size: a median of 3 outvotes one stall
# The warm-up's decode rows differ in length by this many tokens each, as serving's
# do (requests arrive at different times with different prompts): a ragged batch
# needs an attention mask, and MLX on CUDA then leaves its fused decode attention.
# Equal rows measured the H200's GPU 1.4-2x faster than it served bursts.
RAGGED_TOKENS = 3
# A quick GPU measurement measures every batch size up to this one (then each power of
# two and the size after it): a kernel change shows as a step between two sizes.
EVERY_SIZE_TO = 16


@dataclass(frozen=True)
class ProfileResult:
    """One measurement; ``to_json`` is what is stored and printed with --json."""

    backend: str
    device: str
    model: str
    prefill_tok_s: float
    prompt_tokens: int
    decode_tok_s: list[float]  # aggregate tok/s at batch size 1, 2, ... max_active (repaired)
    decode_median_tok_s: list[float]  # as measured: the median of the repeats
    decode_spread: list[float]  # (max - min) / median of the repeats, per batch size
    decode_repaired: list[str]  # what the repair changed, in words (empty: nothing)
    repeats: int
    decode_tokens: int  # tokens each request decoded per measurement
    decode_context: int  # prompt tokens before decoding (serving decodes after prompts)
    max_active: int
    step_tokens: int
    measured_at: str
    simulated: bool

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class _Collector:
    """The engine's ``emit``: counts output tokens, remembers finished ids, raises on errors."""

    def __init__(self) -> None:
        self.tokens = 0
        self.done: set[str] = set()

    def __call__(self, msg: p.Message) -> None:
        if isinstance(msg, p.TokenDelta):
            self.tokens += len(msg.token_ids)
        elif isinstance(msg, p.Done):
            self.done.add(msg.request_id)
        elif isinstance(msg, p.Error):
            raise RuntimeError(f"profiling request {msg.request_id} failed: {msg.message}")


def _engine(
    backend: EngineBackend,
    max_active: int,
    step_tokens: int,
    clock: Callable[[], float] = time.monotonic,
    cache_tokens: int = 0,
) -> tuple[Engine, _Collector]:
    # No prefix cache by default: every prompt must be computed in full.
    cfg = EngineConfig(max_active=max_active, step_tokens=step_tokens, cache_tokens=cache_tokens)
    out = _Collector()
    return Engine(backend, cfg, out, worker_id="profile", clock=clock), out


def _prompt(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(_FIRST_PROMPT_ID, vocab) for _ in range(n)]


def _drain(engine: Engine, until: float | None = None) -> bool:
    """Step until every request is done; with ``until`` (on the engine's clock), give
    up what is left at that time (False): a bounded measurement stays bounded."""
    while engine.queue or engine.active:
        if until is not None and engine.clock() >= until:
            engine.queue.clear()
            for req in list(engine.active):
                engine.finish(req, None, notify=False)  # frees its sequence
            return False
        engine.step()
    return True


def measure_prefill(
    backend: EngineBackend, prompt_tokens: int, repeats: int, step_tokens: int, rng: random.Random
) -> float:
    """Cold prefill tok/s: median over ``repeats`` after one warm-up run."""
    engine, _ = _engine(backend, 1, step_tokens)
    rates = []
    for i in range(repeats + 1):
        prompt = _prompt(rng, prompt_tokens, backend.vocab_size)
        req = Request(f"prefill-{i}", prompt, SamplingParams(max_tokens=1, prefill_only=True))
        t0 = time.perf_counter()
        engine.submit(req)
        _drain(engine)
        if i > 0:  # the first run warms caches and allocations up
            rates.append(prompt_tokens / (time.perf_counter() - t0))
    return statistics.median(rates)


def measure_decode(
    backend: EngineBackend,
    batch: int,
    decode_tokens: int,
    step_tokens: int,
    rng: random.Random,
    context: int = WARM_PROMPT_TOKENS,
) -> float:
    """Aggregate decode tok/s with ``batch`` requests decoding together after
    prompts of ``context`` tokens and a few fewer (rows of unequal length, as in
    serving: ``RAGGED_TOKENS``)."""
    engine, out = _engine(backend, batch, step_tokens)
    n_out = decode_tokens + 1 + SKIP_STEPS
    for i in range(batch):
        prompt = _prompt(rng, max(1, context - RAGGED_TOKENS * i), backend.vocab_size)
        engine.submit(
            Request(
                f"decode-{batch}-{i}", prompt, SamplingParams(max_tokens=n_out, ignore_eos=True)
            )
        )
    while not engine.active or any(r.status is not Status.DECODE for r in engine.active):
        engine.step()  # admission and prefill, not timed
        if not engine.queue and not engine.active:
            raise RuntimeError("decode requests finished before they all decoded together")
    for _ in range(SKIP_STEPS):
        engine.step()
    before, t0 = out.tokens, time.perf_counter()
    _drain(engine)
    return (out.tokens - before) / (time.perf_counter() - t0)


@dataclass(frozen=True)
class WarmUp:
    """What a warm-up measured: the engine's own step statistics of its measuring pass."""

    seconds: float
    stats: StepStats  # as a serving engine records steps (workers/steptimer.py)
    context: int  # prompt tokens each decoding request attended over


def warm_up(
    backend: EngineBackend,
    max_active: int,
    step_tokens: int,
    *,
    context: int = WARMUP_CONTEXT,
    measure_steps: int = WARMUP_STEPS,
    compile_pass: bool = True,
    clock: Callable[[], float] = time.monotonic,
    budget_s: float | None = None,
    deadline_s: float | None = None,
    prefill_probe: bool = True,
    primer: bool = False,
    progress: Callable[[int, int], None] | None = None,
    ladder: Callable[[int], list[int]] = batch_ladder,
) -> WarmUp:
    """Run the shapes serving meets first and measure them, before the worker registers.

    A GPU backend compiles (or loads) kernels the first time it sees a shape, in
    every new process: without a first pass (``compile_pass``), the first requests
    a worker serves pay it (MLX on CUDA: ~150 ms a step at first). The measuring
    pass then times, through a real Engine and its step timer, one prompt of a full
    prefill chunk plus a partial one, and ``measure_steps`` decode steps at batch
    sizes 1, 2, 4, ... and ``max_active`` after prompts of about ``context`` tokens
    (the context serving decodes at; the profile's own), rows of unequal length
    (``RAGGED_TOKENS``) as in serving. The step model's clipped means count a
    stall as at most 4 median steps (common/steptime.py). The worker folds the
    result into the rates it advertises and hands the statistics to its serving
    engine, so the router's live model starts with them instead of a profile's
    word or a guess.

    A quick measurement (``workers.startup``) bounds it: ``budget_s`` (each pass starts
    no batch size past it), ``deadline_s`` (it gives up a batch size
    still running then: on a machine too busy, a few steps can take many seconds),
    no ``prefill_probe`` (the decode context's
    own prefill chunks give the prefill rate), a short ``context``. ``primer``: one
    untimed prompt chunk and decode step first, in an engine of its own, where a
    ``compile_pass`` is not run: a GPU's first call of a process pays its one-time
    set-up (the H200's llama.cpp GPU worker priced its prefill from such a first
    chunk at 0.68-0.79 of what it then served). ``progress(done, total)`` is called
    after each stage (the prefill, each batch size). ``ladder(max_active)``: the batch
    sizes measured, in order (``step_ladder``: every size, the powers of two first).
    """
    t0 = clock()
    if primer and not compile_pass:
        _prime(backend, step_tokens, clock)
    context = max(2, min(context, backend.n_ctx // max(1, max_active) - measure_steps - 64))
    sizes = ladder(max_active)
    # Decode prompts share one cached prefix (the prefix cache, as serving reuses it),
    # so the context costs one prefill, not one per request: a CPU measures in seconds.
    cache = (context + 1) * max_active + step_tokens
    engine = None
    passes = 2 if compile_pass else 1
    total, done = passes * (len(sizes) + prefill_probe), 0
    for n in range(passes):
        rng = random.Random(0)
        engine, _ = _engine(backend, max_active, step_tokens, clock, cache_tokens=cache)
        started = clock()
        until = started + deadline_s if deadline_s is not None and n == passes - 1 else None
        if prefill_probe:  # a full prefill chunk plus a partial one
            prompt = _prompt(rng, min(step_tokens + 17, backend.n_ctx - 1), backend.vocab_size)
            engine.submit(Request("warm-prefill", prompt, SamplingParams(1, prefill_only=True)))
            _drain(engine)
            done += 1
            _report(progress, done, total)
        # Rows ``ragged`` tokens apart, the longest prompt ``context`` tokens: the
        # spread narrows when many rows share a short context (it must fit n_ctx).
        ragged = min(RAGGED_TOKENS, (context - 2) // max(1, max_active - 1))
        prefix = _prompt(rng, context - 1 - ragged * (max_active - 1), backend.vocab_size)
        measured: set[int] = set()  # the batch sizes whose stage ran to its end
        for b in sizes:
            # Each pass (an untimed one too) starts no size past the budget: what is
            # left is priced from its neighbours (workers/rates.py).
            if budget_s is not None and clock() - started > budget_s:
                break
            # Decoding starts as each prompt ends: the first keeps decoding while the
            # others finish theirs, so outputs last long enough for all b to decode together.
            params = SamplingParams(max_tokens=measure_steps + SKIP_STEPS + b + 1, ignore_eos=True)
            for i in range(b):
                tail = _prompt(rng, 1 + ragged * i, backend.vocab_size)
                engine.submit(Request(f"warm-{b}-{i}", [*prefix, *tail], params))
            if not _drain(engine, until):
                _forget_unmeasured(engine.timer.stats, measured)
                break
            measured.add(b)
            done += 1
            _report(progress, done, total)
        for handle in engine.cache.clear():  # the backend keeps nothing of the warm-up
            backend.free(handle)
    assert engine is not None
    engine.timer.stop()
    return WarmUp(clock() - t0, engine.timer.stats, context)


def _prime(backend: EngineBackend, step_tokens: int, clock: Callable[[], float]) -> None:
    """One prompt chunk and one decode step, untimed: the process's first calls."""
    engine, _ = _engine(backend, 1, step_tokens, clock)
    n = max(1, min(step_tokens, backend.n_ctx - 2))
    prompt = _prompt(random.Random(1), n, backend.vocab_size)
    engine.submit(Request("warm-primer", prompt, SamplingParams(max_tokens=2, ignore_eos=True)))
    _drain(engine)


def step_ladder(n: int) -> list[int]:
    """The batch sizes a quick GPU measurement runs, in order: ``batch_ladder``'s powers
    of two first (a budget cut leaves the span measured), then every other size up to
    EVERY_SIZE_TO and, past it, the size after each power of two (where a kernel
    change would show as a step)."""
    first = batch_ladder(n)
    between = list(range(2, min(n, EVERY_SIZE_TO) + 1))
    between += [b + 1 for b in first if EVERY_SIZE_TO <= b < n]
    return first + [b for b in between if b not in first]


def _forget_unmeasured(stats: StepStats, measured: set[int]) -> None:
    """Drop the decode steps of batch sizes whose stage did not run to its end: those
    of a stage given up were taken in a stall (C3 in docs/results/startup.md: 5 tok/s
    where it then served 29-88)."""
    for size in [s for s in stats.decode if s not in measured]:
        del stats.decode[size]


def _report(progress: Callable[[int, int], None] | None, done: int, total: int) -> None:
    if progress is not None:
        progress(done, total)


def kv_cells_needed(
    max_active: int, prompt_tokens: int, decode_tokens: int, decode_context: int | None = None
) -> int:
    """KV cells ``profile_backend`` needs: the prefill prompt, or ``max_active`` decode
    requests at their end (context + every token they produce), whichever is more."""
    context = prompt_tokens if decode_context is None else decode_context
    per_request = context + decode_tokens + 1 + SKIP_STEPS  # see measure_decode's n_out
    return max(prompt_tokens + 1, max_active * per_request)


def profile_backend(
    backend: EngineBackend,
    max_active: int = 4,
    prompt_tokens: int = 512,
    decode_tokens: int = 32,
    repeats: int = 3,
    step_tokens: int = 256,
    seed: int = 0,
    decode_context: int | None = None,
) -> ProfileResult:
    """Measure ``backend``: cold prefill, then decode at every batch size up to max_active."""
    context = prompt_tokens if decode_context is None else decode_context
    if max_active < 1 or prompt_tokens < 1 or decode_tokens < 2 or context < 1:
        raise ValueError("need max_active, prompt_tokens, decode_context >= 1, decode_tokens >= 2")
    if repeats < MIN_REPEATS:
        raise ValueError(f"repeats must be >= {MIN_REPEATS}: one sample cannot tell a stall")
    need = kv_cells_needed(max_active, prompt_tokens, decode_tokens, decode_context)
    if need > backend.n_ctx:
        raise ValueError(f"profiling needs {need} KV cells; n_ctx is {backend.n_ctx}")
    rng = random.Random(seed)
    prefill = measure_prefill(backend, prompt_tokens, repeats, step_tokens, rng)
    measure_decode(backend, 1, min(8, decode_tokens), step_tokens, rng)  # warm-up
    samples: list[list[float]] = [[] for _ in range(max_active)]
    for _ in range(repeats):  # rounds over all sizes: a stall hits one sample of one size
        for b in range(1, max_active + 1):
            samples[b - 1].append(
                measure_decode(backend, b, decode_tokens, step_tokens, rng, context)
            )
    medians = [statistics.median(x) for x in samples]
    fit = fit_decode_rates(medians)
    return ProfileResult(
        backend=backend.name,
        device=backend.device,
        model=profile_model(backend),
        prefill_tok_s=round(prefill, 2),
        prompt_tokens=prompt_tokens,
        decode_tok_s=[round(x, 2) for x in fit.rates],
        decode_median_tok_s=[round(x, 2) for x in medians],
        decode_spread=[
            round((max(x) - min(x)) / m, 4) for x, m in zip(samples, medians, strict=True)
        ],
        decode_repaired=explain(medians, fit),
        repeats=repeats,
        decode_tokens=decode_tokens,
        decode_context=context,
        max_active=max_active,
        step_tokens=step_tokens,
        measured_at=datetime.now(UTC).isoformat(timespec="seconds"),
        simulated=backend.name == "sim",
    )
