#!/usr/bin/env bash
# Replace .venv's llama-cpp-python with a CUDA build on an NVIDIA Linux machine, from a
# wheel kept in the cache (built once: minutes), so that `tandem serve` can put
# llama.cpp on the GPU: it decoded the embedded model 3-4x faster than MLX on an H200
# (docs/results/h200/). deploy/setup.sh runs it where nvidia-smi is found.
# What worked there: the system's GCC (/usr/bin) rather than another toolchain's, and
# GGML_OPENMP=OFF (ggml's own thread pool): a build with an image's own GCC and OpenMP
# segfaulted in model load in every worker (deploy/gpu-box/README.md).
#   bash deploy/llama_cuda.sh        # LLAMA_CUDA_ARCHS: CMake's CUDA architectures (native)
set -euo pipefail
cd "$(dirname "$0")/.."
ver=$(sed -n 's/.*"llama-cpp-python==\([0-9.]*\)".*/\1/p' pyproject.toml | head -1)
py=.venv/bin/python
if "$py" -c 'import llama_cpp, sys; sys.exit(0 if llama_cpp.llama_supports_gpu_offload() else 1)' \
    2>/dev/null; then
  exit 0  # a GPU build is installed already
fi
command -v nvcc > /dev/null || [ -x /usr/local/cuda/bin/nvcc ] || {
  echo "note: no nvcc here, so no CUDA build of llama-cpp-python: tandem serve drives the" \
       "GPU with MLX (slower); install the CUDA toolkit and run deploy/setup.sh again" >&2
  exit 0
}
command -v nvcc > /dev/null || export PATH="/usr/local/cuda/bin:$PATH"
cache=${TANDEM_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tandem/wheels/llama-cuda}
whl=$(ls "$cache"/llama_cpp_python-"$ver"-*.whl 2>/dev/null | head -1 || true)
if [ -z "$whl" ]; then
  echo "building llama-cpp-python $ver with CUDA (once, kept in $cache: minutes)" >&2
  mkdir -p "$cache"
  if [ -x /usr/bin/g++ ]; then export CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++; fi
  export CMAKE_ARGS="-DGGML_CUDA=on -DGGML_OPENMP=OFF -DLLAVA_BUILD=OFF -DGGML_CUDA_NCCL=OFF \
 -DCMAKE_CUDA_ARCHITECTURES=${LLAMA_CUDA_ARCHS:-native}"
  log=$(mktemp)
  # --no-cache-dir: pip's wheel cache would hand back the CPU build it made before
  # (its key is the source, not CMAKE_ARGS).
  if ! "$py" -m pip wheel -q --no-deps --no-cache-dir --no-binary llama-cpp-python \
      -w "$cache" "llama-cpp-python==$ver" > "$log" 2>&1; then
    tail -30 "$log" >&2
    echo "note: the CUDA build of llama-cpp-python failed (above): tandem serve drives the" \
         "GPU with MLX (slower)" >&2
    rm -f "$log"
    exit 0
  fi
  rm -f "$log"
  whl=$(ls "$cache"/llama_cpp_python-"$ver"-*.whl | head -1)
  if ! "$py" -m zipfile -l "$whl" | grep -q 'libggml-cuda'; then
    rm -f "$whl"
    echo "note: llama-cpp-python built without CUDA: tandem serve drives the GPU with MLX" >&2
    exit 0
  fi
fi
"$py" -m pip install -q --no-deps --force-reinstall "$whl"
"$py" -c 'import llama_cpp; print("llama-cpp-python: GPU offload", llama_cpp.llama_supports_gpu_offload())' >&2
