#!/usr/bin/env bash
# Here, after the box's build call: join the wheel's parts that came back into the
# wheel, check it is whole, and keep it in .cuda-wheel/ (git-ignored), where stage.sh
# finds it and ships it instead of building again.
#   bash deploy/gpu-box/keep_wheel.sh FOLDER_WITH_PARTS
set -euo pipefail
from=${1:?usage: keep_wheel.sh FOLDER_WITH_PARTS}
root=$(cd "$(dirname "$0")/../.." && pwd)
first=$(ls "$from"/llama_cpp_python-*.whl.part0 "$from"/llama_cpp_python-*.whl.txz.part0 \
  2>/dev/null | head -1 || true)
[ -n "$first" ] || { echo "no llama_cpp_python-*.whl[.txz].part0 in $from" >&2; exit 1; }
grep -qx '/.cuda-wheel/' "$root/.git/info/exclude" 2>/dev/null \
  || echo '/.cuda-wheel/' >> "$root/.git/info/exclude"
mkdir -p "$root/.cuda-wheel"
if [ "${first%.txz.part0}" != "$first" ]; then  # wheel_xz.sh's parts: the members, xz'd
  name=$(basename "${first%.txz.part0}")
  work=$(mktemp -d)
  cat "${first%0}"? | xz -d | tar xf - -C "$work"
  python3 - "$work" "$root/.cuda-wheel/$name.tmp" <<'PY'
import os, sys, zipfile
src, dst = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as z:
    for base, _, files in sorted(os.walk(src)):
        for f in sorted(files):
            path = os.path.join(base, f)
            z.write(path, os.path.relpath(path, src))
PY
  rm -rf "$work"
else
  name=$(basename "${first%.part0}")
  cat "$from/$name".part? > "$root/.cuda-wheel/$name.tmp"  # part0..part9, in order
fi
# A wheel is a zip: a missing or cut part fails here (CRC or layout), not on the box.
python3 - "$root/.cuda-wheel/$name.tmp" <<'PY'
import os, sys, zipfile
try:
    with zipfile.ZipFile(sys.argv[1]) as z:
        bad = z.testzip()
        cuda = any("libggml-cuda.so" in n for n in z.namelist()) or os.environ.get("KEEP_ANY")
except (OSError, zipfile.BadZipFile) as exc:
    sys.exit(f"not a whole wheel: {exc}")
if bad or not cuda:
    sys.exit(f"damaged member {bad}" if bad else "no libggml-cuda.so: not a CUDA build")
PY
mv "$root/.cuda-wheel/$name.tmp" "$root/.cuda-wheel/$name"
ls -la "$root/.cuda-wheel/$name"
