#!/usr/bin/env bash
# Stage everything tandem needs on a GPU box that reaches no package registry
# (Python 3.12, x86-64 Linux, NVIDIA, CUDA 13): wheels for what the box lacks, the
# llama-cpp-python wheel built on this machine, and the default model file.
#   usage: deploy/gpu-box/stage.sh STAGE_DIR
# Then split STAGE_DIR into chunks that each fit one device call and send them
# (see deploy/gpu-box/README.md), and run deploy/gpu-box/run.sh there.
set -euo pipefail
stage=${1:?usage: stage.sh STAGE_DIR}
root=$(cd "$(dirname "$0")/../.." && pwd)
py=${PYTHON:-$root/.venv/bin/python}
mkdir -p "$stage"
dl() {
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_39_x86_64 --platform manylinux_2_35_x86_64 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$stage" "$@"
}
# Versions pinned to what tandem is tested with; the box already has numpy,
# msgpack, click, psutil, tokenizers, transformers, jinja2, matplotlib, rich.
dl mlx==0.32.4 mlx-cuda-13==0.32.4 mlx-lm==0.32.2 pyzmq==27.3.0 gguf==0.19.0 diskcache==5.6.3 \
  msgspec==0.23.0
# llama-cpp-python compiles from source; ship the wheel pip built (and cached) here.
whl=$(find "${PIP_CACHE_DIR:-$HOME/.cache/pip}" -name 'llama_cpp_python-0.3.36-*.whl' | head -1)
[ -n "$whl" ] || { echo "no llama-cpp-python wheel in the pip cache: run deploy/setup.sh first" >&2; exit 1; }
cp "$whl" "$stage/"
model=$("$py" -c 'from tandem.common.model_files import default_model_path; print(default_model_path())')
mkdir -p "$stage/models" && cp "$model" "$stage/models/"
# Qwen2's tokenizer for the shaped Qwen2.5 model (the box cannot fetch it).
vocab=$("$py" -m tandem.bench.vocab_files qwen2)
mkdir -p "$stage/vocab" && cp "$vocab" "$stage/vocab/"
du -sh "$stage"/* >&2
