"""The GGUF header reader, the weights digest, and the router's same-weights check."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tandem.broker.registry import ready_problem
from tandem.common import protocol as p
from tandem.common.gguf_file import read_gguf_header, weights_digest
from tests.helpers import tiny_tokenizer

gguf = pytest.importorskip("gguf")


def write(path: Path, name: str = "m", scale: float = 1.0, tokens: int = 3) -> Path:
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(name)
    w.add_block_count(2)
    w.add_token_list([f"t{i}" for i in range(tokens)])
    w.add_token_scores([0.5] * tokens)
    w.add_add_bos_token(True)
    w.add_tensor("a.weight", np.arange(64 * 40, dtype=np.float32).reshape(40, 64) * scale)
    w.add_tensor("b.weight", np.ones(7, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_header_matches_the_gguf_package_reader(tmp_path: Path) -> None:
    path = write(tmp_path / "m.gguf")
    header = read_gguf_header(path)
    assert header.kv["general.name"] == "m" and header.kv["llama.block_count"] == 2
    assert header.kv["tokenizer.ggml.tokens"] == ["t0", "t1", "t2"]
    assert header.kv["tokenizer.ggml.scores"] == [0.5] * 3
    assert header.kv["tokenizer.ggml.add_bos_token"] is True
    reader = gguf.GGUFReader(str(path))
    theirs = {t.name: (tuple(int(d) for d in t.shape), int(t.data_offset)) for t in reader.tensors}
    ours = {t.name: (t.shape, header.data_start + t.offset) for t in header.tensors}
    assert ours == theirs


def test_digest_follows_the_weights_not_the_metadata(tmp_path: Path) -> None:
    base = weights_digest(write(tmp_path / "a.gguf"))
    assert weights_digest(write(tmp_path / "b.gguf", name="renamed", tokens=5)) == base
    assert weights_digest(write(tmp_path / "c.gguf", scale=2.0)) != base


def test_not_a_gguf_is_value_error(tmp_path: Path) -> None:
    (tmp_path / "x.gguf").write_bytes(b"NOPE" + bytes(40))
    with pytest.raises(ValueError, match="not a GGUF"):
        read_gguf_header(tmp_path / "x.gguf")


def ready(model: str, weights: str) -> p.Ready:
    return p.Ready("w", "llama.cpp", "cpu", model, 4, 4096, 16, 1.0, [1.0], 0.5,
                   tiny_tokenizer(), weights=weights)  # fmt: skip


def test_router_compares_digests_when_both_sides_have_one() -> None:
    # A GGUF and the MLX folder converted from it: names differ, weights equal.
    assert ready_problem(ready("model-folder", "d1"), "m.gguf", True, "d1") is None
    problem = ready_problem(ready("m.gguf", "d2"), "m.gguf", True, "d1")
    assert (
        problem is not None and "different weights" in problem.message and "d2" in problem.message
    )
    # Without a digest on either side, the names decide as before.
    assert ready_problem(ready("m.gguf", ""), "m.gguf", True, "d1") is None
    assert ready_problem(ready("other.gguf", ""), "m.gguf", True, "d1") is not None
    assert ready_problem(ready("any", "d9"), None, False, "") is None  # the first worker
