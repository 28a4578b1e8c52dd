#!/bin/bash
# Alternate `tandem bench router --runs 1` between two checkouts, each with its own
# .venv (an old commit: `git worktree add`, a copy of .venv with the editable finder
# pointed at it): ab.sh OLD_CHECKOUT NEW_CHECKOUT ROUNDS TAG OUTDIR [SESSION]
# (SESSION names the files rb-SESSION-TAG-SIDE-N.json; s12 unless given)
set -euo pipefail
old=$1 new=$2 rounds=$3 tag=$4 out=$5 session=${6:-s12}
mkdir -p "$out"
for i in $(seq 1 "$rounds"); do
  for side in old new; do
    d=$old; [ "$side" = new ] && d=$new
    (cd "$d" && .venv/bin/tandem bench router --runs 1 --out "$out/rb-$session-$tag-$side-$i.json" >/dev/null 2>&1)
  done
done
