"""A mixed cluster on a model family other than the default: a llama.cpp worker on a
shaped Qwen2 GGUF and an MLX worker on the mlx-lm folder converted from it. The router
matches them by weights digest (their model names differ) and refuses a worker whose
file has other weights."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from studies.models.shaped_model import SHAPES, write_shaped_model
from tandem.launcher.cluster import Cluster, WorkerSpec
from tests.helpers import LLAMA_ARGS, needs_llama

pytestmark = [pytest.mark.model, pytest.mark.mlx, needs_llama]
MLX_ARGS = ["--backend", "mlx", "--device", "cpu", "--n-ctx", "1024", "--heartbeat-s", "0.2",
            "--warmup", "off"]  # fmt: skip
EXIT_WAIT_S = 120


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the GGUF, the mlx-lm folder converted from it)."""
    pytest.importorskip("mlx_lm")
    from tandem.workers.backends.mlx.model import gguf_cache_path, load_mlx_model

    root = tmp_path_factory.mktemp("qwen2-cluster")
    try:
        path = write_shaped_model(SHAPES["tiny-qwen2"], root / "tiny-qwen2.gguf")
    except FileNotFoundError as e:  # the Qwen2 vocabulary could not be fetched
        pytest.skip(str(e))
    load_mlx_model(path, cache_dir=root / "mlx")
    return path, gguf_cache_path(path, root / "mlx")


def test_llama_cpp_and_mlx_serve_one_qwen2_model(qwen2, tmp_path: Path) -> None:
    gguf, folder = qwen2
    workers = [
        WorkerSpec("cpu0", [*LLAMA_ARGS, "--model", str(gguf)]),
        WorkerSpec("mlx0", [*MLX_ARGS, "--model", str(folder)]),
    ]
    messages = [{"role": "user", "content": "Name three primary colors."}]
    with Cluster(workers=workers, start_timeout_s=180) as cl, cl.client(timeout_s=180) as c:
        rows = {w["id"]: w for w in c.status().workers}
        assert rows["mlx0"]["backend"] == "mlx" and rows["cpu0"]["backend"] == "llama.cpp"
        assert rows["mlx0"]["model"] != rows["cpu0"]["model"]  # a folder and a file
        out = {
            w: c.generate(messages=messages, max_tokens=4, ignore_eos=True, worker=w)
            for w in ("cpu0", "mlx0")
        }
        assert out["cpu0"].worker == "cpu0" and out["mlx0"].worker == "mlx0"
        assert len(out["cpu0"].token_ids) == len(out["mlx0"].token_ids) == 4
        # Same random weights, same chat-templated prompt: the same first token
        # (top-1 agrees at ~97 % of positions, so later tokens may part).
        assert out["cpu0"].token_ids[0] == out["mlx0"].token_ids[0]

        other = write_shaped_model(SHAPES["tiny-qwen2"], tmp_path / "tiny-qwen2.gguf", seed=1)
        cl.start_worker(WorkerSpec("cpu1", [*LLAMA_ARGS, "--model", str(other)]), wait=False)
        proc = cl.procs["cpu1"]
        deadline = time.monotonic() + EXIT_WAIT_S
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert proc.returncode not in (None, 0)  # refused: same name, other weights
        assert "different weights" in cl.log("cpu1")
        assert {w["id"] for w in c.status().workers} == {"cpu0", "mlx0"}
