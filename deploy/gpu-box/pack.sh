#!/usr/bin/env bash
# Here: pack a stage.sh folder into chunks that each ride one device call, in .ship/cN/
# (git-ignored; call N carries .ship/cN and runs `bash deploy/gpu-box/recv.sh`: no step
# here between calls). The tar is ordered so that what a box may not need comes last:
# wheels/, models/, vocab/, llama-cuda/, then llama-cpu/ (needed only where no CUDA build
# is there): its last chunk need not be sent when the box built or got the CUDA wheel
# (run.sh unpacks what arrived). Also copies the Mooncake trace into .ship/trace/.
#   bash deploy/gpu-box/pack.sh STAGE_DIR      # CHUNK_MB (48): the chunk size in MiB
# A call's travel is its chunk plus the working tree (~6.5 MB) plus what else it
# carries (the build call: .lcp, 5.4 MB): 48 MiB keeps the build call under 60 MiB.
set -euo pipefail
stage=$(realpath "${1:?usage: pack.sh STAGE_DIR}")
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
grep -qx '/.ship/' .git/info/exclude 2>/dev/null || echo '/.ship/' >> .git/info/exclude
rm -rf .ship && mkdir -p .ship/parts .ship/trace
order=()
last=llama-cpu
[ -d "$stage/llama-cuda" ] && last=""  # no CPU build needed beside a kept CUDA one
for d in wheels models vocab mlx-ptx llama-cuda $last; do
  if [ -d "$stage/$d" ]; then order+=("$(basename "$stage")/$d"); fi
done
tar cf .ship/all.tar -C "$(dirname "$stage")" "${order[@]}"
split -b "${CHUNK_MB:-48}M" -d .ship/all.tar .ship/parts/chunk.
rm .ship/all.tar
for f in .ship/parts/chunk.*; do
  n=$((10#${f##*.}))
  mkdir -p ".ship/c$n" && mv "$f" ".ship/c$n/"
done
rmdir .ship/parts
trace=$root/../shared/traces/mooncake_synthetic.jsonl
[ -f "$trace" ] && cp "$trace" .ship/trace/
tree=$(( $(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1) / 1048576 ))
for c in .ship/c*; do
  echo "$c: $(du -m "$c"/chunk.* | cut -f1) MiB (+ the tracked tree ~$tree MiB)"
done
echo "tar order: ${order[*]}"
