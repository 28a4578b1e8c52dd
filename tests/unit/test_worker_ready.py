"""A worker's Ready tells the router what it serves (workers/main.py ready_message)."""

from __future__ import annotations

from types import SimpleNamespace

from tandem.common import protocol as p
from tandem.common.tokenizer import TokenizerSpec
from tandem.workers.config import WorkerConfig
from tandem.workers.main import ready_message
from tests.helpers import tiny_tokenizer


def test_the_ready_names_the_backends_sampling_capabilities() -> None:
    # The line once sat after a return in another function (found by mypy's
    # warn_unreachable): Readys named none, so the router sent such requests nowhere.
    backend = SimpleNamespace(
        name="sim", device="cpu", model_name="m.gguf", n_ctx=4096, weights_digest="",
        tokenizer_spec=TokenizerSpec.from_wire(tiny_tokenizer()),
        capabilities=("min_p", "logprobs"),
    )  # fmt: skip
    ready = ready_message(WorkerConfig(router="tcp://127.0.0.1:1"), backend, "w0", 100.0, [50.0])
    assert ready.capabilities == ["min_p", "logprobs"]
    assert p.decode(p.encode(ready)).capabilities == ["min_p", "logprobs"]
