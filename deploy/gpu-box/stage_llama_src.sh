#!/usr/bin/env bash
# Here: llama-cpp-python 0.3.36's sdist (73 MB: a .git pack, vocabularies, docs, every
# backend's sources) cut down to what a CUDA + CPU build reads, ~5 MB, in .lcp/ (git-
# ignored), for the box's build call to carry (build_llama_cuda.sh).
#   bash deploy/gpu-box/stage_llama_src.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
py=${PYTHON:-$root/.venv/bin/python}
ver=0.3.36
cd "$root"
grep -qx '/.lcp/' .git/info/exclude 2>/dev/null || echo '/.lcp/' >> .git/info/exclude
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$py" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$ver" -d "$work"
mkdir -p "$work/src" && tar xzf "$work/llama_cpp_python-$ver.tar.gz" -C "$work/src"
pkg=$work/src/llama_cpp_python-$ver v=$pkg/vendor/llama.cpp
# Nothing below is read by a Linux CUDA build without llava (LLAVA_BUILD=OFF): other
# backends' sources (added only when enabled), tools/examples/tests (a subproject
# builds none), vocabularies, docs. vendor/miniaudio stays: vendor/ adds it always.
rm -rf "$pkg/.git" "$pkg/docs" "$pkg/tests" "$pkg/examples" "$v/.git" "$v/docs" "$v/benches" \
  "$v/media" "$v/gguf-py" "$v/conversion" "$v/scripts" "$v/tests" "$v/examples" \
  "$v/tools/ui" "$v/tools/server" "$v"/models/*.gguf
for b in blas cann et hexagon hip metal musa opencl openvino rpc sycl virtgpu vulkan webgpu \
         zdnn zendnn; do
  rm -rf "$v/ggml/src/ggml-$b"
done
rm -rf .lcp && mkdir -p .lcp
tar czf ".lcp/llama_cpp_python-$ver.tar.gz" -C "$work/src" "llama_cpp_python-$ver"
ls -la .lcp
