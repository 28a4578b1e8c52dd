#!/usr/bin/env bash
# The GPU-box measurement campaign, in stages, inside one time budget.
#   bash deploy/gpu-box/run.sh bash deploy/gpu-box/campaign.sh mlx profile seed8 seed48
#   bash deploy/gpu-box/run.sh bash deploy/gpu-box/campaign.sh sweep traffic
# Results go to $OUT/h200/ and are packed into $OUT/h200-<stages>.tgz at the end (a
# device call returns few files). BUDGET_S bounds the whole call; a stage that
# would start with < 20 s left is skipped, one that runs out is cut (the bench
# saves after every run, so a cut stage keeps its finished runs). RUNS sets the
# runs per case of the seed stages (the preset's 3 unless device time is short).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
: "${OUT:?OUT must name the results folder}"
out="$OUT/h200"
mkdir -p "$out"
deadline=$(( $(date +%s) + ${BUDGET_S:-560} ))
PY=${PY:-python3}
CPU=${CPU_WORKER:-llama.cpp:threads=12:id=cpu}
GPU=${GPU_WORKER:-mlx:device=gpu:id=gpu}
ALL_POLICIES=(--policy forced:gpu --policy forced:cpu --policy round_robin --policy least_loaded
              --policy cache_aware --policy phase_cost)

stage() {  # stage NAME CMD...: run CMD with what is left of the budget, log to $out/NAME.log
  local name=$1; shift
  local left=$(( deadline - $(date +%s) ))
  if [ "$left" -lt 20 ]; then echo "skip $name: budget spent" | tee -a "$out/skipped.txt"; return; fi
  echo "== $name ($left s left) $*" | tee -a "$out/stages.txt"
  local t0=$(date +%s)
  timeout "$left" "$@" > "$out/$name.log" 2>&1
  echo "   $name: rc $? in $(( $(date +%s) - t0 )) s" | tee -a "$out/stages.txt"
}

{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  nproc; $PY -c 'import mlx.core as mx, llama_cpp; print("mlx", mx.__version__, "llama_cpp", llama_cpp.__version__)'
} > "$out/machine.txt" 2>&1

for s in "$@"; do
  case "$s" in
    mlx) stage mlx-vs-raw $PY -m bench.mlx_compare --device gpu --batches 1,2,4,8,16 \
           --n-out 128 --repeats 3 --out "$out/mlx-vs-raw.md" ;;
    profile)
      stage profile-cpu $PY -m client profile --backend llama.cpp --threads 12 --json
      stage profile-gpu $PY -m client profile --backend mlx --device gpu --max-active 16 --json ;;
    seed8|seed48) stage "$s" $PY -m client bench --preset seed --worker "$CPU" --worker "$GPU" \
           "${ALL_POLICIES[@]}" --requests "${s#seed}" --runs "${RUNS:-3}" --no-progress \
           --out "$out/$s" ;;
    sweep) stage sweep $PY -m client bench --preset seed --worker "$CPU:max_active=4" \
           --worker "$GPU" --policy forced:gpu --policy phase_cost --requests 48 \
           --sweep-max-active 1,2,4,8,16 --runs 1 --rates advertised --no-progress \
           --out "$out/sweep" ;;
    traffic)
      stage poisson $PY -m client bench --worker "$CPU" --worker "$GPU" --policy forced:gpu \
           --policy phase_cost --workload poisson --rate 6 --duration-s 15 --runs 1 \
           --hit-mix 1.0 --rates advertised --no-progress --out "$out/poisson"
      stage onoff $PY -m client bench --worker "$CPU" --worker "$GPU" --policy forced:gpu \
           --policy phase_cost --workload onoff --bursts 3 --requests 16 --gap-s 4 --runs 1 \
           --rates advertised --no-progress --out "$out/onoff" ;;
    *) echo "unknown stage $s" >&2 ;;
  esac
done
tar czf "$OUT/h200-$(IFS=-; echo "$*").tgz" -C "$OUT" h200 && rm -rf "$out"
