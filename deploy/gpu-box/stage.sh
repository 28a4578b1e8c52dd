#!/usr/bin/env bash
# Stage everything tandem needs on a GPU box that reaches no package registry
# (Python 3.12, x86-64 Linux, NVIDIA, CUDA 13): wheels for what the box lacks, the
# llama-cpp-python wheels, and the default model file.
#   usage: deploy/gpu-box/stage.sh STAGE_DIR
# Layout (run.sh reads it): wheels/ (installed as they are), llama-cuda/ (the CUDA build
# kept by keep_wheel.sh, when there is one: no rebuild on the box), llama-cpu/ (the
# CPU build pip made here: used only where no CUDA build is there), models/, vocab/.
# Then split STAGE_DIR into chunks that each fit one device call and send them
# (see deploy/gpu-box/README.md), and run deploy/gpu-box/run.sh there.
set -euo pipefail
stage=${1:?usage: stage.sh STAGE_DIR}
root=$(cd "$(dirname "$0")/../.." && pwd)
py=${PYTHON:-$root/.venv/bin/python}
mkdir -p "$stage/wheels" "$stage/llama-cpu" "$stage/models" "$stage/vocab"
dl() {
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_39_x86_64 --platform manylinux_2_35_x86_64 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$stage/wheels" "$@"
}
# Versions pinned to what tandem is tested with; the box already has numpy, msgpack,
# click, psutil, tokenizers, transformers, jinja2, huggingface_hub, prometheus-client,
# anyio, h11, uvloop, tqdm, matplotlib, rich, scikit-build-core, cmake, ninja.
# starlette, uvicorn and httptools: the gateway (pyproject's dependencies).
dl mlx==0.32.4 mlx-cuda-13==0.32.4 mlx-lm==0.32.2 pyzmq==27.3.0 gguf==0.19.0 diskcache==5.6.3 \
  msgspec==0.23.0 starlette==1.10.0 uvicorn==0.55.0 httptools==0.9.0
# llama-cpp-python compiles from source. The CUDA build made on a box earlier
# (keep_wheel.sh), if any; and the CPU build pip made here, for a box without it.
kept=$(ls "$root"/.cuda-wheel/llama_cpp_python-0.3.36-*.whl 2>/dev/null | head -1 || true)
if [ -n "$kept" ]; then mkdir -p "$stage/llama-cuda" && cp "$kept" "$stage/llama-cuda/"; fi
whl=$(find "${PIP_CACHE_DIR:-$HOME/.cache/pip}" -name 'llama_cpp_python-0.3.36-*.whl' | head -1)
[ -n "$whl" ] || { echo "no llama-cpp-python wheel in the pip cache: run deploy/setup.sh first" >&2; exit 1; }
cp "$whl" "$stage/llama-cpu/"
# MLX's compiled CUDA kernels sent back by an earlier campaign (run.sh puts them in place).
if [ -f "$root/.cuda-wheel/mlx-ptx.tgz" ]; then
  mkdir -p "$stage/mlx-ptx" && tar xzf "$root/.cuda-wheel/mlx-ptx.tgz" -C "$stage/mlx-ptx"
fi
model=$("$py" -c 'from tandem.common.model_files import default_model_path; print(default_model_path())')
cp "$model" "$stage/models/"
# Qwen2's tokenizer for the shaped Qwen2.5 models (the box cannot fetch it).
cp "$(cd "$root" && "$py" -m studies.models.vocab_files qwen2)" "$stage/vocab/"
du -sh "$stage"/* >&2
