#!/usr/bin/env bash
# Here, after pack.sh: the code the box's campaign calls run, as one commit — not the
# shared working tree, which others edit while the calls go (their half-done edits
# would travel too). Writes .ship/head.tgz (git archive of COMMIT, docs/results left
# out), then checks that very tree: shell syntax, imports, and (unless QUICK=1) an
# engines stage on two CPU workers here (~60 s). A campaign call carries .ship/head.tgz,
# unpacks it in /root/head and runs from there (deploy/gpu-box/README.md).
#   bash studies/gpu-box/snapshot.sh [COMMIT]      # default HEAD
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
py=${PYTHON:-$root/.venv/bin/python}
commit=$(git -C "$root" rev-parse "${1:-HEAD}") || exit 2
mkdir -p "$root/.ship"
git -C "$root" archive --format=tar.gz -o "$root/.ship/head.tgz" "$commit" -- . ':!docs/results'
echo "$commit" > "$root/.ship/head.commit"
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
tar xzf "$root/.ship/head.tgz" -C "$tree"
for room in bench broker cli client common gateway launcher twin workers; do
  ln -sfn "$tree/$room" "$tree/tandem/$room"
done
fail=0
for f in "$tree"/deploy/gpu-box/*.sh "$tree"/studies/gpu-box/*.sh; do bash -n "$f" || { echo "FAIL syntax: $f"; fail=1; }; done
# From inside the tree: a script on stdin puts the current folder first on sys.path.
(cd "$tree" && PYTHONPATH=$tree "$py" - "$tree") <<'PY' || fail=1
import importlib, sys
import tandem
assert tandem.__file__.startswith(sys.argv[1]), f"tandem came from {tandem.__file__}"
for m in ("tandem.cli", "tandem.bench.run", "studies.models.shaped_model", "tandem.broker.router",
          "tandem.workers.main", "tandem.workers.backends.llama", "tandem.twin.replay"):
    importlib.import_module(m)
print("imports ok")
PY
if [ -z "${QUICK:-}" ] && [ "$fail" = 0 ]; then
  out=$tree/out
  mkdir -p "$out"
  (cd "$tree" && OUT=$out TANDEM_CACHE_DIR=$out/cache PY=$py PYTHONPATH=$tree PINNING="" \
    RUNSP=1 BUDGET_S=150 CPU_ENGINE="llama.cpp:threads=1:id=cpu:max_active=2" \
    LGPU_ENGINE="llama.cpp:threads=1:id=lgpu" ENG_POLICIES="--policy forced:lgpu --policy least_loaded" \
    bash studies/gpu-box/campaign.sh engines:embedded:cpu+lgpu:2:2:140 > "$out/log" 2>&1)
  if ! grep -q "rc 0 in" "$out/log" || ! grep -q "| forced:lgpu |" "$out/log"; then
    echo "FAIL: an engines stage on two CPU workers:"; tail -5 "$out/log"
    tar xzf "$out"/h200-*.tgz -C "$out" 2>/dev/null && tail -5 "$out"/h200/eng-*.log
    fail=1
  fi
fi
ls -la "$root/.ship/head.tgz"
if [ "$fail" = 0 ]; then echo "snapshot ok: $commit"; else echo "SNAPSHOT FAILED: $commit"; fi
exit "$fail"
