#!/usr/bin/env bash
# On the GPU box: build llama-cpp-python 0.3.36 with CUDA (sm_90 only) from the trimmed
# sdist that stage_llama_src.sh packed here (.lcp/), install it into $site for
# the rest of the warm session, and split the wheel into <= 15 MiB parts under $OUT
# so that it comes back (keep_wheel.sh joins them here; stage.sh ships it later).
#   bash deploy/gpu-box/build_llama_cuda.sh        # BUILD_S: the build's cap (default 500)
# The CMake build folder stays in /root/lcp-build: a call cut by its cap leaves it
# there, and the same command in the next call (box still warm) resumes the build.
# Logs: $OUT/build.log (every line stamped with seconds since the start) and
# $OUT/build-phases.txt (the box's tools, then the phase times): two files, leaving
# six of $OUT's eight to the wheel's parts.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
: "${OUT:?OUT must name the folder that comes back}"
sdist=${LCP_SDIST:-$(ls "$root"/.lcp/llama_cpp_python-*.tar.gz 2>/dev/null | head -1)}
base=${LCP_DIR:-/root} site=${SITE:-/tmp/site}  # overridable for a dry run elsewhere
src=$base/lcp-src build=$base/lcp-build wheels=$base/lcp-wheel
log=$OUT/build.log phases=$OUT/build-phases.txt
t0=$(date +%s)
# CMake finds nvcc on PATH (or CUDACXX); the toolkit's usual place, where PATH lacks it.
command -v nvcc > /dev/null || export PATH="/usr/local/cuda/bin:$PATH"
# The system's compilers, not the image's /opt/gcc (its CC/CXX/CUDAHOSTCXX), and no
# OpenMP (ggml's own thread pool): a wheel built with /opt/gcc and OpenMP segfaulted in
# model load in every tandem worker on the box (README.md, "What the box said").
if [ -x /usr/bin/g++ ] && [ -z "${LCP_KEEP_COMPILERS:-}" ]; then
  export CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++
fi
phase() { echo "$1 $(( $(date +%s) - t0 )) s" | tee -a "$phases"; }

{ nvcc --version | tail -2; cmake --version | head -1; ninja --version
  python3 -c 'import scikit_build_core, sys; print("scikit-build-core", scikit_build_core.__version__, sys.version.split()[0])'
  nproc; lscpu | grep -E 'Model name|Flags' | cut -c1-400
  for h in /usr/local/cuda/include/cublas_v2.h /usr/local/cuda/targets/x86_64-linux/include/cublas_v2.h; do
    [ -e "$h" ] && echo "cublas header: $h"; done
  ldconfig -p | grep -E 'libcublas\.so|libcudart\.so' | head -4
} > "$phases" 2>&1

[ -n "$sdist" ] && [ -f "$sdist" ] || { echo "no sdist under .lcp/ (stage_llama_src.sh)" | tee "$log"; exit 2; }
if [ ! -d "$src" ]; then mkdir -p "$src" && tar xzf "$sdist" -C "$src"; fi
pkg=$(ls -d "$src"/llama_cpp_python-* | head -1)
phase unpacked

# sm_90 only, SASS only (90-real: no PTX to embed or JIT); the flash attention kernels'
# default K/V set; no mtmd (llava) library, which tandem never loads; no NCCL (one GPU
# a worker); CUDA graphs on (a decode step is one graph launch). The CPU part is built
# for the instruction set of the machine that built the earlier CPU wheel (AVX-512
# with VBMI/VNNI/BF16, which ran on this box), not -march=native, so the kept wheel
# runs on the next box of this kind too.
export CMAKE_ARGS=${LCP_CMAKE_ARGS:-"-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90-real -DLLAVA_BUILD=OFF \
 -DGGML_CUDA_NCCL=OFF -DGGML_CUDA_GRAPHS=ON -DGGML_CCACHE=OFF -DLLAMA_OPENSSL=OFF \
 -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
 -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_OPENMP=OFF"}
export CMAKE_BUILD_PARALLEL_LEVEL=${JOBS:-16} CMAKE_GENERATOR=Ninja
# A toolkit without cuBLAS (only nvcc): take the one PyTorch's pip packages bring.
tk=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
if [ ! -e "$tk/include/cublas_v2.h" ] && [ ! -e "$tk/targets/x86_64-linux/include/cublas_v2.h" ]; then
  h=$(find /usr /opt -name cublas_v2.h 2>/dev/null | head -1)
  if [ -n "$h" ]; then
    lib=$(dirname "$(dirname "$h")")/lib
    CPATH="$(dirname "$h")${CPATH:+:$CPATH}" LIBRARY_PATH="$lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
    export CPATH LIBRARY_PATH
    CMAKE_ARGS+=" -DCUDA_cublas_LIBRARY=$(ls "$lib"/libcublas.so* | head -1)"
    CMAKE_ARGS+=" -DCUDA_cublasLt_LIBRARY=$(ls "$lib"/libcublasLt.so* | head -1)"
    echo "cuBLAS from $h" >> "$phases"
  fi
fi
mkdir -p "$wheels"
# Each line stamped with the seconds since the start: scikit-build-core's "***"
# lines mark configure / build / install / wheel, ninja's [n/m] the progress.
timeout "${BUILD_S:-500}" python3 -m pip wheel --no-build-isolation --no-deps -v -w "$wheels" \
  --config-settings build-dir="$build" "$pkg" 2>&1 \
  | while IFS= read -r line; do printf '%4d %s\n' $(( $(date +%s) - t0 )) "$line"; done > "$log"
rc=${PIPESTATUS[0]}
grep -E '^ *[0-9]+ +\*\*\*' "$log" >> "$phases"
grep -E '^ *[0-9]+ +\[[0-9]+/[0-9]+\]' "$log" | tail -1 | cut -c1-60 >> "$phases"
phase "pip-wheel-rc-$rc"
whl=$(ls "$wheels"/llama_cpp_python-*.whl 2>/dev/null | head -1)
if [ "$rc" -ne 0 ] || [ -z "$whl" ]; then
  tail -30 "$log" | cut -c1-240; echo "build incomplete (rc $rc): run this script again to resume"; exit 1
fi
# The wheel holds every library twice: in llama_cpp/lib (what llama_cpp loads, RPATH
# $ORIGIN) and in lib/ + include/ (ggml's own CMake install rules): the copies go, so
# that the wheel comes back in fewer parts (<= 8 files, 64 MiB under $OUT).
python3 "$root/deploy/gpu-box/slim_wheel.py" "$whl" | tee -a "$phases"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$site" "$whl" && touch "$site"/.llama-cuda
# libggml-cuda needs libcudart/libcublas 13: where the loader does not find them, the
# folder that holds them is kept for run.sh (LD_LIBRARY_PATH). The check loads the
# library itself: `import llama_cpp` would need diskcache, which the chunks bring later.
check() {
  python3 -c 'import ctypes, glob, sys
lib = ctypes.CDLL(sorted(glob.glob(sys.argv[1] + "/llama_cpp/lib/libllama.so*"))[0])
lib.llama_print_system_info.restype = ctypes.c_char_p
lib.llama_backend_init()
print("gpu offload", bool(lib.llama_supports_gpu_offload()))
print(lib.llama_print_system_info().decode())' "$site"
}
if ! check > /dev/null 2>&1; then
  so=$(find /usr /opt -name 'libcublas.so.13*' 2>/dev/null | head -1)
  [ -n "$so" ] && dirname "$so" > "$site"/.llama-cuda-ld
fi
if [ -f "$site"/.llama-cuda-ld ]; then
  LD_LIBRARY_PATH="$(cat "$site"/.llama-cuda-ld)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export LD_LIBRARY_PATH
fi
check 2>&1 | tee -a "$phases"
ldd "$(find "$site"/llama_cpp/lib -name 'libggml-cuda.so*' | head -1)" | grep -E 'cuda|cublas|not found' >> "$phases"
phase installed
ls -la "$whl" | tee -a "$phases"
split -b 15M -d -a 1 "$whl" "$OUT/$(basename "$whl").part"
n=$(ls "$OUT"/*.part* | wc -l)
[ "$n" -le 6 ] || echo "WARNING: $n parts: more than 8 files under \$OUT, some will not come back"
phase split
