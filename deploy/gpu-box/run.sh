#!/usr/bin/env bash
# On the GPU box, from the repository root: install the staged wheels once (into
# /tmp/site, no index), point tandem at the staged model, then run "$@".
#   bash deploy/gpu-box/run.sh python3 -m tandem profile --backend mlx --device gpu
# llama-cpp-python: one build serves both workers (two cannot be installed side by side).
# The CUDA build wins: the one build_llama_cuda.sh installed in this warm session, else
# a kept one staged under llama-cuda/; the CPU build (llama-cpu/) only where neither is.
# A CPU worker stays off the GPU in a CUDA build (workers/backends/llama_params.py).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
parts=${TANDEM_PARTS:-/root/parts}
staged=${STAGE_ROOT:-/root/stage} site=${SITE:-/tmp/site}  # overridable for a dry run
pipi() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$site" "$@"; }
if [ ! -f "$site/.tandem-staged" ]; then
  mkdir -p "$staged"
  # The last chunk (the tail of the CPU build, pack.sh) is not sent where the box has
  # the CUDA build: what arrived is unpacked, and tar's complaint about the end noted.
  if ! cat "$parts"/chunk.* | tar xf - -C "$staged" 2> "$staged/untar.err"; then
    echo "run.sh: the staged tar ends early (its last chunk not sent?):" \
      "$(tail -1 "$staged/untar.err")" >&2
  fi
  mapfile -t whls < <(find "$staged" -path '*/wheels/*.whl')
  pipi "${whls[@]}"
  if [ ! -f "$site/.llama-cuda" ]; then
    cuda=$(find "$staged" -path '*/llama-cuda/*.whl' | head -1)
    if [ -n "$cuda" ]; then
      pipi "$cuda" && touch "$site/.llama-cuda"
    else
      pipi "$(find "$staged" -path '*/llama-cpu/*.whl' | head -1)"
    fi
  fi
  touch "$site/.tandem-staged"
fi
# libggml-cuda's libcublas/libcudart 13, where the loader alone does not find them
# (build_llama_cuda.sh notes the folder).
if [ -f "$site/.llama-cuda-ld" ]; then
  LD_LIBRARY_PATH="$(cat "$site/.llama-cuda-ld")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export LD_LIBRARY_PATH
fi
# tandem is not installed there (no index to build it with): make the checkout
# importable as `tandem.*` by linking each room into the package root, as the
# package-dir mapping of pyproject.toml does for an install.
for room in bench broker cli client common gateway launcher twin workers; do
  ln -sfn "$root/$room" "$root/tandem/$room"
done
export PYTHONPATH="$site:$root${PYTHONPATH:+:$PYTHONPATH}"
# the staged folder keeps its own name inside the tar (stage.sh STAGE_DIR): search below it
TANDEM_MODEL=${TANDEM_MODEL:-$(find "$staged" -path '*/models/*.gguf' | head -1)}
export TANDEM_MODEL TANDEM_CACHE_DIR=${TANDEM_CACHE_DIR:-/root/tandem-cache}
export PYTHONUNBUFFERED=1
# MLX compiles its CUDA kernels (NVRTC) in a box's first MLX process, ~180 s: they are
# cached in a named folder that campaign.sh sends back (mlx-ptx.tgz) and stage.sh ships
# again (mlx-ptx/), so a later session's first MLX worker starts warm.
export MLX_PTX_CACHE_DIR=${MLX_PTX_CACHE_DIR:-$TANDEM_CACHE_DIR/mlx-ptx}
ptx=$(find "$staged" -type d -name mlx-ptx | head -1)
if [ ! -d "$MLX_PTX_CACHE_DIR" ]; then
  mkdir -p "$MLX_PTX_CACHE_DIR"
  if [ -n "$ptx" ]; then cp -r "$ptx"/. "$MLX_PTX_CACHE_DIR"/; fi
fi
vocab=$(find "$staged" -type d -name vocab | head -1)
if [ -n "$vocab" ]; then  # staged tokenizer vocabularies (studies/models/vocab_files.py)
  mkdir -p "$TANDEM_CACHE_DIR/vocab"
  for f in "$vocab"/*.gguf; do  # kept from an earlier call while the box stays warm
    [ -e "$TANDEM_CACHE_DIR/vocab/${f##*/}" ] || cp "$f" "$TANDEM_CACHE_DIR/vocab/"
  done
fi
exec "$@"
