#!/usr/bin/env bash
# On the box: keep the chunks this call carried (.ship/cN/chunk.NN) outside the repo copy,
# in /root/parts, where they wait (while the box stays warm) for run.sh to unpack them.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p /root/parts
found=$(find "$root/.ship" -path '*/c[0-9]*/chunk.*' 2>/dev/null | sort)
[ -n "$found" ] || { echo "recv.sh: this call carried no chunk (.ship/cN)" >&2; exit 1; }
# shellcheck disable=SC2086  # one path a line, no spaces
cp $found /root/parts/
ls -la /root/parts
