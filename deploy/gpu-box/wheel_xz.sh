#!/usr/bin/env bash
# On the box, after build_llama_cuda.sh: the CUDA wheel's members as one tar.xz split
# into <= 15 MiB parts under $OUT, in place of the wheel's own parts. A wheel's members
# are deflated one by one, and one xz stream over them packs tighter: the 69.4 MB
# wheel came back as 61.6 MB of parts in one call (its zip parts took two: the call
# returns 64 MiB at most). Here, keep_wheel.sh joins either kind of part.
#   bash deploy/gpu-box/wheel_xz.sh [WHEEL]     # default: the one in /root/lcp-wheel
set -euo pipefail
: "${OUT:?OUT must name the folder that comes back}"
whl=${1:-$(ls /root/lcp-wheel/llama_cpp_python-*.whl | head -1)}
work=$(mktemp -d)
python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$whl" "$work"
if command -v xz > /dev/null; then
  tar cf - -C "$work" . | xz -T0 -6 > "$work.txz"
else
  tar cJf "$work.txz" -C "$work" .
fi
rm -f "$OUT/$(basename "$whl")".part*
split -b 15M -d -a 1 "$work.txz" "$OUT/$(basename "$whl").txz.part"
ls -la "$whl" "$work.txz"
rm -rf "$work" "$work.txz"
