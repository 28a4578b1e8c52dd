#!/usr/bin/env bash
# The GPU-box measurement campaign, in stages, inside one device call's time budget.
#   bash deploy/gpu-box/run.sh bash studies/gpu-box/campaign.sh profile knobs sweep onoff
#   bash deploy/gpu-box/run.sh bash studies/gpu-box/campaign.sh poisson seed48 seed8
# Results go to $OUT/h200/ and are packed into $OUT/h200-<stages>.tgz at the end (a
# device call returns few files). BUDGET_S bounds the whole call; each stage also
# has its own cap, and one that would start with < 20 s left is skipped (the bench
# saves after every run, so a cut stage keeps its finished runs). RUNS8 / RUNS48
# set the runs per case of the seed stages (the preset's 3 by default), RUNSQ those
# of the `qwen` stage (a Qwen2.5-0.5B-shaped model with random weights; 1 run).
# RUNSP, PROOF_POLICIES, SWEEP, MATRIX_N, GPU_MAX, RATE, WARM, STEP_TRACE: see below.
#
# The box keeps files between calls only while it stays warm, so settings chosen by
# the `knobs` stage are kept in $TANDEM_CACHE_DIR/campaign.env and read by later calls.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
: "${OUT:?OUT must name the results folder}"
: "${TANDEM_CACHE_DIR:?run through deploy/gpu-box/run.sh}"
out="$OUT/h200"
mkdir -p "$out"
deadline=$(( $(date +%s) + ${BUDGET_S:-560} ))
PY=${PY:-python3}
THREADS=${CPU_THREADS:-12}
CPU=${CPU_WORKER:-llama.cpp:threads=$THREADS:id=cpu}
GPU=${GPU_WORKER:-mlx:device=gpu:id=gpu}
ALL_POLICIES=(--policy forced:gpu --policy forced:cpu --policy round_robin --policy least_loaded
              --policy cache_aware --policy phase_cost)
# The decode rates a fresh GPU profile once gave on this box (issue 13): 11 tok/s at batch 2.
OUTLIER=${OUTLIER:-180,11,332,560,632,748,656,698,653,571,622,793,502,606,481,529}
# WARM=1: a bench group's workers start once and serve all its runs, each run with a
# fresh router (`tandem bench --reuse-workers`): a GPU worker's start is most of a
# fresh run's device time, and a serving worker's step model is what a router meets.
REUSE=${WARM:+--reuse-workers}
# STEP_TRACE=1: every worker writes each engine step it times to $OUT/h200/steps/
# (workers/steptimer.py: start, batch, context, prefill, seconds), packed with the rest.
[ -n "${STEP_TRACE:-}" ] && export TANDEM_STEP_TRACE_DIR="$out/steps"
envfile="$TANDEM_CACHE_DIR/campaign.env"
# shellcheck disable=SC1090
[ -f "$envfile" ] && { set -a; . "$envfile"; set +a; cp "$envfile" "$out/campaign.env"; }

stage() {  # stage NAME CAP_S CMD...: run CMD for at most CAP_S (and what is left), log it
  local name=$1 cap=$2; shift 2
  local left=$(( deadline - $(date +%s) ))
  if [ "$left" -lt 20 ]; then echo "skip $name: budget spent" | tee -a "$out/stages.txt"; return; fi
  [ "$cap" -lt "$left" ] && left=$cap
  echo "== $name ($left s) $*" | tee -a "$out/stages.txt"
  local t0 rc
  t0=$(date +%s)
  timeout "$left" "$@" > "$out/$name.log" 2>&1
  rc=$?
  echo "   $name: rc $rc in $(( $(date +%s) - t0 )) s" | tee -a "$out/stages.txt"
  return "$rc"
}

# shellcheck source=studies/gpu-box/engines.sh
. "$root/studies/gpu-box/engines.sh"

profile_gpu() {  # profile_gpu NAME [--no-save]
  stage "$1" 240 $PY -m tandem profile --backend mlx --device gpu --max-active 16 --json "${@:2}"
}

{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  nproc; $PY -c 'import mlx.core as mx, llama_cpp as L; print("mlx", mx.__version__, "llama_cpp",
L.__version__, "gpu offload", L.llama_supports_gpu_offload())'
  env | grep '^MLX_' || true
} > "$out/machine.txt" 2>&1

for s in "$@"; do
  case "$s" in
    mlx) stage mlx-vs-raw 300 $PY -m studies.mlx_compare --device gpu --batches 1,2,4,8,16 \
           --n-out 128 --repeats 3 --out "$out/mlx-vs-raw.md" ;;
    gap)  # the GPU worker's decode steps in-process, aligned vs churning batches, on
      # the host cores the serving worker is pinned to (studies/step_gap.py); GAP_NEIGHBOUR=1:
      # each also beside a llama.cpp engine decoding on the CPU worker's cores
      stage step-gap 240 taskset -c 10-11 $PY -m studies.step_gap --backend mlx \
         --device gpu --batch "${GAP_BATCHES:-4,8}" --steps 256 --rounds 3 \
         --modes "${GAP_MODES:-aligned,churn,serve,serve-switch}" \
         ${GAP_NEIGHBOUR:+--neighbour-cpus 0-9 --neighbour-threads "$THREADS"} --out "$out/step-gap.json" ;;
    profile)
      stage profile-cpu 60 $PY -m tandem profile --backend llama.cpp --threads "$THREADS" --json
      profile_gpu profile-gpu ;;
    knobs)  # MLX's CUDA graphs on (its default) or off: decode shapes change every step
      MLX_USE_CUDA_GRAPHS=0 profile_gpu profile-gpu-graphs0 --no-save
      if $PY studies/gpu-box/pick_knob.py "$out/profile-gpu.log" "$out/profile-gpu-graphs0.log" \
           > "$out/knobs.txt" 2>&1; then
        echo "MLX_USE_CUDA_GRAPHS=0" > "$envfile"
        export MLX_USE_CUDA_GRAPHS=0
        profile_gpu profile-gpu-chosen  # store the rates the workers will run at
      fi
      cat "$out/knobs.txt" ;;
    seed8|seed48)
      runs_var="RUNS${s#seed}"
      stage "$s" 480 $PY -m tandem bench --preset seed --worker "$CPU" --worker "$GPU" \
           "${ALL_POLICIES[@]}" --requests "${s#seed}" --runs "${!runs_var:-3}" --no-progress \
           --out "$out/$s" ;;
    sweep) stage sweep 360 $PY -m tandem bench --preset seed --worker "$CPU:max_active=4" \
           --worker "$GPU" --policy forced:gpu --policy phase_cost --requests 48 \
           --sweep-max-active "${SWEEP:-1,2,4,8,16}" --runs 1 --rates advertised --no-progress \
           --out "$out/sweep" ;;
    poisson|onoff)  # open-loop traffic, half the requests on the seeded prefix, the
      # rest distinct; pinned as in `matrix`, PROOF_POLICIES interleaved (RUNSP runs)
      if [ "$s" = poisson ]; then shape=(--rate "${RATE:-6}" --duration-s 15)
      else shape=(--bursts 3 --requests 16 --gap-s 4); fi
      stage "$s" "${TRAFFIC_CAP:-300}" $PY -m tandem bench --workload "$s" "${shape[@]}" \
         --worker "$CPU:cpus=0-9:max_active=4" --worker "$GPU:cpus=10-11:max_active=${GPU_MAX:-4}" \
         --router-cpus 12 --cpus 13-15 --hit-mix 0.5 --distinct-prompts ${REUSE} \
         ${PROOF_POLICIES:---policy forced:gpu --policy least_loaded --policy finish_time} \
         --runs "${RUNSP:-3}" --rates advertised --no-progress --out "$out/$s" ;;
    qwen)  # the article's model shape, random weights (studies/models/shaped_model.py), Qwen's own
      # tokenizer (the staged vocabulary): timing only. No profiles: both workers
      # measure themselves at start (--warmup auto). Pinned as in `proof`.
      q="$TANDEM_CACHE_DIR/qwen2.5-0.5b-shaped-qwen2vocab.gguf"
      [ -f "$q" ] || stage qwen-model 180 $PY -m studies.models.shaped_model qwen2.5-0.5b "$q" --vocab qwen2
      for n in ${QWEN_BURSTS:-8 48}; do
        stage "qwen-seed$n" 300 $PY -m tandem bench --preset seed --requests "$n" \
           --worker "llama.cpp:$q:threads=$THREADS:id=cpu:cpus=0-9" \
           --worker "mlx:$q:device=gpu:id=gpu:cpus=10-11:max_active=${GPU_MAX:-16}" \
           --router-cpus 12 --cpus 13-15 --policy forced:gpu --policy least_loaded \
           --policy finish_time --runs "${RUNSQ:-1}" --rates advertised --no-progress \
           --out "$out/qwen-seed$n"
      done ;;
    pinning)  # the same 8-burst with every process on all cores, then pinned, interleaved
      # (RUNSP rounds): llama.cpp on cores 0-9 (CPU_THREADS=10 for both), the GPU
      # worker's host thread on 10-11, the router on 12, the load generator on 13-15
      for i in $(seq 1 "${RUNSP:-3}"); do
        for mode in shared pinned; do
          if [ "$mode" = pinned ]; then
            pin=(--worker "$CPU:cpus=0-9" --worker "$GPU:cpus=10-11" --router-cpus 12 --cpus 13-15)
          else
            pin=(--worker "$CPU" --worker "$GPU")
          fi
          stage "pin-$mode-$i" 150 $PY -m tandem bench --preset seed "${pin[@]}" --requests 8 \
             --policy forced:gpu --policy phase_cost --runs 1 --rates advertised --no-progress \
             --out "$out/pin-$mode-$i"
        done
      done ;;
    proof)  # the seed 48-burst, pinned, policies interleaved per run (RUNSP runs) at
      # GPU max active GPU_MAX: forced:gpu, least_loaded and the default policy
      stage "proof-${GPU_MAX:-16}" 560 $PY -m tandem bench --preset seed --requests 48 \
         --worker "$CPU:cpus=0-9" --worker "$GPU:cpus=10-11:max_active=${GPU_MAX:-16}" \
         --router-cpus 12 --cpus 13-15 ${PROOF_POLICIES:---policy forced:gpu --policy least_loaded \
         --policy finish_time} --runs "${RUNSP:-3}" --rates advertised --no-progress \
         --out "$out/proof-${GPU_MAX:-16}" ;;
    matrix)  # issue 13's matrix: the seed burst of MATRIX_N requests at every GPU max
      # active in SWEEP (the CPU held at 4), pinned as in `proof`, PROOF_POLICIES
      # interleaved per run (RUNSP runs), one bench invocation and one result folder
      n=${MATRIX_N:-8}
      stage "matrix-$n" "${MATRIX_CAP:-560}" $PY -m tandem bench --preset seed --requests "$n" \
         --worker "$CPU:cpus=0-9:max_active=4" --worker "$GPU:cpus=10-11" \
         --sweep-max-active "${SWEEP:-1,4,8,16}" --router-cpus 12 --cpus 13-15 ${REUSE} \
         ${PROOF_POLICIES:---policy forced:gpu --policy least_loaded --policy finish_time} \
         --runs "${RUNSP:-3}" --rates advertised --no-progress --out "$out/matrix-$n" ;;
    trace)  # the Mooncake trace (TRACE: a JSONL file carried to the box, by default
      # .ship/trace/), prompt lengths / 16 with the sharing kept, the first TRACE_LIMIT
      # requests, pinned as in `matrix`; forced:cpu (~3x the others' makespan) in a
      # second bench of one run so that the rest get RUNSP runs inside one call
      tr=${TRACE:-$(ls "$root"/.ship/trace/*.jsonl | head -1)}
      common=(--workload trace --trace "$tr" --length-scale 16 --limit "${TRACE_LIMIT:-30}"
              --worker "$CPU:cpus=0-9:max_active=4" --worker "$GPU:cpus=10-11:max_active=${GPU_MAX:-8}"
              --router-cpus 12 --cpus 13-15 ${REUSE} --rates advertised --no-progress)
      stage trace "${TRACE_CAP:-330}" $PY -m tandem bench "${common[@]}" \
         ${PROOF_POLICIES:---policy forced:gpu --policy round_robin --policy least_loaded \
         --policy finish_time} --runs "${RUNSP:-3}" --out "$out/trace"
      stage trace-cpu 150 $PY -m tandem bench "${common[@]}" --policy forced:cpu --runs 1 \
         --out "$out/trace-cpu" ;;
    outlier)  # the default policy with the GPU told the box's outlier profile (as rate
      # flags) against the same worker measuring itself with nothing told, interleaved
      for i in $(seq 1 "${RUNSP:-3}"); do
        for told in outlier measured; do
          flags=""
          [ "$told" = outlier ] && flags=":prefill_tok_s=15413:decode_tok_s=$OUTLIER"
          stage "outlier-$told-$i" 150 $PY -m tandem bench --preset seed --requests 48 \
             --worker "$CPU:cpus=0-9" --worker "$GPU:cpus=10-11:max_active=${GPU_MAX:-16}$flags" \
             --router-cpus 12 --cpus 13-15 --policy finish_time --runs 1 --rates advertised \
             --no-progress --out "$out/outlier-$told-$i"
        done
      done ;;
    serve|serve-mlx)  # `tandem serve` as a user starts it: `serve` cold (run it first on
      # a fresh box) and warm; `serve-mlx` once more after MLX has a stored profile
      # too, so that the engine is chosen by both engines' measurements
      # (studies/serve_ready.py: time to ready, the plan and engines, GPU memory per
      # process). Its own cache folder: the profiles its workers keep (13 threads,
      # unpinned) must not price the bench's workers.
      serve_cache=${SERVE_CACHE:-/root/serve-cache}
      sr() { TANDEM_CACHE_DIR=$serve_cache stage "serve-$1" 150 $PY -m studies.serve_ready \
               --label "$1" --out "$out/serve.json" -- "${@:2}"; }
      if [ "$s" = serve ]; then
        sr cold; sr warm
      else
        TANDEM_CACHE_DIR=$serve_cache profile_gpu serve-profile-mlx
        sr measured
      fi
      cp "$out/serve.json" "$OUT/$s.json" 2>/dev/null
      $PY -c 'import json,sys; d=json.load(open(sys.argv[1])); print({k: v for k, v in d.items() if k != "runs"})' \
        "$out/serve.json" | tee -a "$out/stages.txt" ;;
    held:*)  # held:DEVICE:HELD:BATCHES (studies/held_cells.py): llama.cpp's decode step
      # with HELD cells (a comma list) of other sequences in its pool, on the CPU
      # worker's cores (cpu, ENG_THREADS threads) or the llama.cpp GPU worker's (gpu)
      IFS=: read -r _ hdev hheld hbatch <<< "$s"
      if [ "$hdev" = cpu ]; then hpin=0-9 hth=$ENG_THREADS hunit=1024; else hpin=12 hth=1 hunit=2048; fi
      stage "held-$hdev" "${HELD_CAP:-200}" taskset -c "$hpin" $PY studies/held_cells.py \
         --device "$hdev" --threads "$hth" --held "$hheld" --batches "$hbatch" --unit "$hunit" \
         --rounds "${HELD_ROUNDS:-3}" --out "$out/held-$hdev.json"
      tail -n 30 "$out/held-$hdev.log" | tee -a "$out/stages.txt" ;;
    engines:*) engines "$s" ;;  # engines:MODEL:WORKERS:GPU_MAX:BURSTS[:CAP_S] (engines.sh)
    *) echo "unknown stage $s" >&2 ;;
  esac
done
# MLX's compiled kernels (run.sh names the folder): back here for the next session's
# stage (keep them in .cuda-wheel/ beside the wheel); left out if over $OUT's 16 MiB.
if [ -n "$(ls -A "${MLX_PTX_CACHE_DIR:-/nonexistent}" 2>/dev/null)" ]; then
  tar czf "$OUT/mlx-ptx.tgz" -C "$MLX_PTX_CACHE_DIR" .
  [ "$(stat -c %s "$OUT/mlx-ptx.tgz")" -le 16000000 ] || rm -f "$OUT/mlx-ptx.tgz"
fi
# $OUT's names may hold letters, digits, '.', '_' and '-' only (a stage name has ':' ...)
tag=$(IFS=-; echo "$*" | tr -c 'A-Za-z0-9._\n-' '_' | cut -c1-120)
tar czf "$OUT/h200-${TAG:-$tag}.tgz" -C "$OUT" h200 && rm -rf "$out"
