"""A CPU worker's weights (llama_weights.py) and how it meets the kernels (llama_rows.py):
the Q8_0 conversion loads, scores the text as the source does and is cached; the choice
follows what was measured; rows decoded a call each give each request the tokens it
gets decoded alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import needs_llama

pytestmark = needs_llama


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("TANDEM_CACHE_DIR", str(tmp_path))
    return tmp_path / "weights"


def _source() -> Path:
    from tandem.common.model_files import default_model_path

    return Path(default_model_path())


def test_q8_0_is_converted_once_and_scores_the_text_as_the_source(cache):
    from tandem.workers.backends import llama_weights as W

    path, fmt = W.served_weights(_source(), "q8_0", threads=1)
    assert fmt == "q8_0" and path.parent == cache
    assert W.dominant_type(_source()) == 3 and W.dominant_type(path) == 8  # GGML_TYPE_Q8_0
    stamp = path.stat().st_mtime_ns
    assert W.served_weights(_source(), "q8_0", threads=1) == (path, "q8_0")
    assert path.stat().st_mtime_ns == stamp, "converted once, then reused"
    src, conv = W._time(_source(), 1), W._time(path, 1)
    assert abs(conv.nll - src.nll) <= W.MAX_NLL_RISE * src.nll
    # A Q8_0 file is not converted again: served as given.
    assert W.served_weights(path, "auto", threads=1) == (path, "")


def test_auto_keeps_what_was_measured_and_records_why(cache, monkeypatch):
    from tandem.workers.backends import llama_weights as W

    fast, slow = W.Timing(500.0, 0.008, 3.00), W.Timing(250.0, 0.008, 3.00)
    timings = {"src": slow, "conv": fast}
    monkeypatch.setattr(W, "_time", lambda p, t: timings["conv" if "q8_0" in p.name else "src"])
    path, fmt = W.served_weights(_source(), "auto", threads=3)
    assert fmt == "q8_0" and path.name.endswith(".q8_0.gguf")
    record = json.loads(next(cache.glob("*.t3.json")).read_text())
    assert record["converted"] and record["scores_alike"] and record["threads"] == 3
    # The record is reused: a changed timing does not change the choice on this machine.
    timings["conv"] = slow
    assert W.served_weights(_source(), "auto", threads=3) == (path, "q8_0")
    # Another thread count measures again: not faster by 10 %, the file as given.
    assert W.served_weights(_source(), "auto", threads=2) == (_source(), "")
    # Faster but scoring differently: never kept.
    timings["conv"] = W.Timing(500.0, 0.008, 3.10)
    assert W.served_weights(_source(), "auto", threads=4) == (_source(), "")
    assert not json.loads(next(cache.glob("*.t4.json")).read_text())["scores_alike"]


def test_auto_serves_the_file_where_the_cache_cannot_take_a_conversion(tmp_path, monkeypatch):
    from tandem.workers.backends import llama_weights as W

    blocked = tmp_path / "file"
    blocked.write_text("")  # the cache root is a file: no folder can be made under it
    monkeypatch.setenv("TANDEM_CACHE_DIR", str(blocked))
    assert W.served_weights(_source(), "auto", threads=1) == (_source(), "")
    with pytest.raises(OSError):
        W.served_weights(_source(), "q8_0", threads=1)


def test_as_is_and_bad_choices(cache):
    from tandem.workers.backends import llama_weights as W
    from tandem.workers.config import WorkerConfig

    assert W.served_weights(_source(), "as-is", threads=1) == (_source(), "")
    assert not cache.exists() or not any(cache.iterdir()), "as-is converts nothing"
    with pytest.raises(ValueError, match="weights must be one of"):
        W.served_weights(_source(), "q4_0", threads=1)
    with pytest.raises(ValueError, match="weights must be one of"):
        WorkerConfig(router="tcp://127.0.0.1:1", weights="fp4")


def test_a_converted_worker_names_and_identifies_its_source(cache):
    from tandem.common.gguf_file import weights_digest
    from tandem.workers.backends.llama import LlamaBackend
    from tandem.workers.config import WorkerConfig
    from tandem.workers.profiles import profile_model

    cfg = WorkerConfig(router="tcp://127.0.0.1:1", threads=1, n_ctx=256, weights="q8_0")
    backend = LlamaBackend.from_config(cfg, _source())
    try:
        assert backend.model_path.parent == cache
        assert backend.model_name == _source().name
        assert backend.weights_digest == weights_digest(_source())
        assert profile_model(backend) == f"{_source().name}@q8_0", "its own stored rates"
    finally:
        backend.close()


def test_the_row_probe_splits_where_two_rows_cost_more_than_two_calls(monkeypatch):
    import llama_cpp as L

    from tandem.workers.backends import llama_rows
    from tandem.workers.backends.llama import LlamaBackend

    backend = LlamaBackend(_source(), n_ctx=256, threads=1, max_active=2, step_tokens=64)
    try:
        free = list(backend.free_seqs)
        for per_row, two_rows, want in ((0.010, 0.025, 1), (0.010, 0.012, None)):
            fake = lambda b, rows, a=per_row, c=two_rows: c if len(rows) > 1 else a  # noqa: E731
            monkeypatch.setattr(llama_rows, "_timed", fake)
            assert llama_rows.measure(backend)[0] == want
        assert backend.free_seqs == free
        for seq in free:
            assert L.llama_memory_seq_pos_max(backend.mem, seq) == -1, "the probe's cells freed"
    finally:
        backend.close()


def test_the_kernel_probe_is_kept_per_file_and_threads(cache, monkeypatch):
    from tandem.workers.backends import llama_rows
    from tandem.workers.backends.llama import LlamaBackend

    backend = LlamaBackend(_source(), n_ctx=1024, threads=1, max_active=2, step_tokens=256)
    try:
        first = (backend.rows_per_call, backend.min_chunk_tokens)
        assert len(list(cache.glob("*.t1.kernels.json"))) == 1

        def no_probe(b):
            raise AssertionError("probed again")

        monkeypatch.setattr(llama_rows, "measure", no_probe)
        assert llama_rows.probed(backend) == first
        backend.threads = 2  # another thread count is another record
        with pytest.raises(AssertionError, match="probed again"):
            llama_rows.probed(backend)
    finally:
        backend.close()


def test_the_chunk_floor_is_the_smallest_chunk_near_the_largest_cost_a_token():
    from tandem.workers.backends.llama_rows import floor_of

    assert floor_of({32: 0.0030, 64: 0.0021, 128: 0.0020}) == 64  # Q8_0 here
    assert floor_of({32: 0.0042, 64: 0.0040, 128: 0.0041}) == 1  # Q4_1: no floor
    assert floor_of({32: 0.0090, 64: 0.0060, 128: 0.0020}) == 128


def test_the_engine_never_cuts_a_chunk_below_the_backends_floor():
    from tandem.common import protocol as p
    from tandem.workers.backends.llama import LlamaBackend
    from tandem.workers.config import EngineConfig
    from tandem.workers.engine import Engine
    from tandem.workers.request import Request

    backend = LlamaBackend(_source(), n_ctx=2048, threads=1, max_active=2, step_tokens=256)
    try:
        backend.min_chunk_tokens = 96
        cfg = EngineConfig(max_active=2, step_tokens=256, step_budget_x=1.5, cache_tokens=0)
        engine = Engine(backend, cfg, lambda m: None, "w")
        chunks: list[int] = []
        run = backend.run

        def watch(decode, prefill):
            chunks.extend(k for _, k in prefill if decode)
            return run(decode, prefill)

        backend.run = watch
        greedy = p.SamplingParams(max_tokens=40, min_tokens=40, temperature=0.0)
        engine.submit(Request("a", [1, 504, 3458, 314], greedy))
        for _ in range(30):  # a's rows decode and the live model learns their steps
            engine.step()
        engine.submit(Request("b", [300 + i for i in range(400)], greedy))
        while engine.queue or engine.active:
            engine.step()
        assert chunks and min(chunks[:-1]) >= 96, chunks
    finally:
        backend.close()


def _generate(backend, prompts: list[list[int]], together: bool, keep: list | None = None):
    from tandem.common import protocol as p
    from tandem.workers.config import EngineConfig
    from tandem.workers.engine import Engine
    from tandem.workers.request import Request

    out: list = []
    cfg = EngineConfig(max_active=4, step_tokens=64, cache_tokens=0, max_tokens_limit=64)
    engine = Engine(backend, cfg, out.append, "w")
    if keep is not None:
        keep.append(engine)
    batches = [prompts] if together else [[x] for x in prompts]
    for i, batch in enumerate(batches):
        for j, prompt in enumerate(batch):
            greedy = p.SamplingParams(max_tokens=6, temperature=0.0)
            engine.submit(Request(f"r{i}-{j}", prompt, greedy))
        while engine.queue or engine.active:
            engine.step()
    tokens: dict[str, list[int]] = {}
    for m in out:
        if isinstance(m, p.TokenDelta):
            tokens.setdefault(m.request_id, []).extend(m.token_ids)
    return [tokens[k] for k in sorted(tokens)]


def test_rows_a_call_each_decode_as_each_request_alone():
    from tandem.workers.backends.llama import LlamaBackend

    backend = LlamaBackend(_source(), n_ctx=1024, threads=1, max_active=4, step_tokens=64,
                           cache_entries=None)  # fmt: skip
    try:
        backend.rows_per_call = 1
        prompts = [[1, 504, 3458, 314, 260, 2373 + k, 30, 378 + k] for k in range(3)]
        together = _generate(backend, prompts, together=True)
        alone = _generate(backend, prompts, together=False)
        assert together == alone
        assert all(len(t) == 6 for t in together)
    finally:
        backend.close()


def test_a_pool_filling_mid_step_keeps_the_rows_that_ran():
    """Rows a call each: the pool may fill at the step's prompt call after its decode
    rows ran. Those rows are kept (their cells and chains are not run twice); the
    prompt chunk runs in a later step; every request gets the tokens it gets without."""
    from tandem.workers.backends.llama import LlamaBackend
    from tandem.workers.engine import KVFull

    backend = LlamaBackend(_source(), n_ctx=1024, threads=1, max_active=4, step_tokens=64,
                           cache_entries=None)  # fmt: skip
    try:
        backend.rows_per_call = 1
        prompts = [[300 + (7 * i + k) % 900 for i in range(40)] for k in range(3)]
        plain = _generate(backend, prompts, together=True)
        call, full = backend._call, {"left": 2}

        def fills(decode, prefill):
            if prefill and full["left"] and any(r.decoding for r in backend_rows()):
                full["left"] -= 1
                raise KVFull()
            return call(decode, prefill)

        backend_rows = lambda: list(engine_ref[0].active)  # noqa: E731
        engine_ref: list = []
        backend._call = fills
        filled = _generate(backend, prompts, together=True, keep=engine_ref)
        assert full["left"] == 0, "the pool filled mid-step twice"
        assert filled == plain
    finally:
        backend.close()
