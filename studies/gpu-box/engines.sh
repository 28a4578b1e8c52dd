# shellcheck shell=bash
# campaign.sh's `engines` stage (sourced): the seed bursts on a router with up to three
# engines on one box — llama.cpp on the CPU cores, llama.cpp on the GPU (a CUDA build),
# MLX on the GPU — or any pair of them, policies interleaved per round.
#
#   engines:MODEL:WORKERS:GPU_MAX:BURSTS[:CAP_S]
#     MODEL    embedded (the default SmolLM2-135M) | qwen05 | qwen7 (Qwen2.5-0.5B / -7B
#              shapes, random weights, Qwen's tokenizer: written on the box once per
#              warm session, ~10 s and ~2-3 min)
#     WORKERS  cpu, lgpu, mgpu joined by '+', e.g. cpu+lgpu+mgpu, lgpu+mgpu
#     GPU_MAX  the GPU workers' max active, a comma list (--sweep-max-active; the CPU
#              stays at 4)
#     BURSTS   burst sizes, a comma list (8,48)
#     CAP_S    this stage's cap in seconds (ENG_CAP, 560, by default; the call's
#              BUDGET_S bounds it too): a later stage of the call keeps its time
#   e.g. engines:embedded:cpu+lgpu+mgpu:16:8,48
#
# Policies: forced:<each GPU worker>, least_loaded and the router's default (its name
# read from the code), ENG_POLICIES to replace them; RUNSP runs (3), the bench's CV
# rule adds 2 where a case spreads. A group's workers serve all its runs
# (--reuse-workers), a fresh router per run. Pinned: the CPU worker's 10 threads on
# cores 0-9, MLX's host thread on 10-11 (as in every earlier H200 round: a box's first
# MLX process compiles its kernels there, ~180 s pinned so), the llama.cpp GPU worker's
# on 12, the router on 13, the load generator on 14-15. A CPU worker runs the CUDA build with no GPU device
# (workers/backends/llama_params.py). CPU_ENGINE / LGPU_ENGINE / MGPU_ENGINE replace
# a worker's spec and PINNING the router/load-generator pinning (a dry run on a
# small machine). After the bench, study.py's summary goes to stages.txt: per group
# each policy's makespan and TTFT, and every worker's advertised / served rates.

ENG_THREADS=${ENG_THREADS:-10}
# Both GPU engines share one GPU, and MLX would size its prefix cache from the GPU's
# free memory (workers/memory.py: 0.8 of it): a fixed device tier instead, llama.cpp's
# GPU default (every cell its pool holds slows its decode steps), room for 12 of the
# seed preset's 644-token requests. Until issue 43's second session: 16,384.
GPU_CACHE=${GPU_CACHE:-8192}

default_policy() {
  $PY -c 'from tandem.broker.policies import DEFAULT_POLICY as d; print(d)' 2>/dev/null \
    || echo lookahead
}

shaped() {  # shaped SHAPE: sets $model_path to its GGUF, written once per warm box
  model_path="$TANDEM_CACHE_DIR/$1-shaped-qwen2vocab.gguf"
  [ -f "$model_path" ] && return 0
  mkdir -p "$TANDEM_CACHE_DIR"
  # Written beside, then moved: a write cut by its cap leaves no half model behind.
  if stage "write-$1" "$2" $PY -m studies.models.shaped_model "$1" "$model_path.tmp" \
       --vocab qwen2; then
    mv "$model_path.tmp" "$model_path"
  else
    rm -f "$model_path.tmp"
    return 1
  fi
}

with_model() {  # with_model SPEC: SPEC with the model file after its backend
  local spec=$1
  [ -n "$model_path" ] || { echo "$spec"; return; }
  echo "${spec%%:*}:$model_path:${spec#*:}"
}

engines() {  # engines engines:MODEL:WORKERS:GPU_MAX:BURSTS[:CAP_S]
  local _ model names sweep bursts cap w n name
  local -a spec=() pol=() req=()
  IFS=: read -r _ model names sweep bursts cap <<< "$1"
  if [ -z "$bursts" ]; then echo "engines: want engines:MODEL:WORKERS:GPU_MAX:BURSTS, not $1" >&2; return; fi
  model_path=""
  case "$model" in
    embedded) ;;
    qwen05) shaped qwen2.5-0.5b 180 || return ;;
    qwen7) shaped qwen2.5-7b 300 || return ;;
    *) echo "engines: unknown model $model (embedded, qwen05, qwen7)" >&2; return ;;
  esac
  for w in ${names//+/ }; do
    case "$w" in
      cpu) spec+=(--worker "$(with_model "${CPU_ENGINE:-llama.cpp:threads=$ENG_THREADS:id=cpu:cpus=0-9:max_active=4}")") ;;
      lgpu) spec+=(--worker "$(with_model "${LGPU_ENGINE:-llama.cpp:device=gpu:threads=1:id=lgpu:cpus=12:cache_tokens=$GPU_CACHE}")")
            pol+=(--policy forced:lgpu) ;;
      mgpu) spec+=(--worker "$(with_model "${MGPU_ENGINE:-mlx:device=gpu:id=mgpu:cpus=10-11:cache_tokens=$GPU_CACHE}")")
            pol+=(--policy forced:mgpu) ;;
      *) echo "engines: unknown worker $w (cpu, lgpu, mgpu)" >&2; return ;;
    esac
  done
  pol+=(--policy least_loaded --policy "$(default_policy)")
  if [ -n "${ENG_POLICIES:-}" ]; then read -r -a pol <<< "$ENG_POLICIES"; fi
  for n in ${bursts//,/ }; do req+=(--requests "$n"); done
  name="eng-$model-${names//+/-}-a${sweep//,/-}-n${bursts//,/-}"
  local pinning=${PINNING-"--router-cpus 13 --cpus 14-15"}
  # shellcheck disable=SC2086  # $pinning is a list of flags
  stage "$name" "${cap:-${ENG_CAP:-560}}" $PY -m tandem bench --preset seed "${req[@]}" "${spec[@]}" \
    --sweep-max-active "$sweep" $pinning --reuse-workers \
    "${pol[@]}" --runs "${RUNSP:-3}" --rates advertised --no-progress --out "$out/$name"
  if [ -f "$out/$name/result.json" ]; then
    $PY "$root/studies/gpu-box/study.py" summary "$out/$name/result.json" 2>&1 \
      | tee -a "$out/stages.txt"
  fi
}
