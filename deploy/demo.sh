#!/usr/bin/env bash
# Set up, start the cluster from the Procfile (router + one llama.cpp CPU worker)
# on the embedded default model, answer one prompt, shut the cluster down.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
PROMPT=${1:-"Name three primary colors."}
honcho start -f Procfile >/tmp/tandem-demo.log 2>&1 &
HONCHO=$!
trap 'kill $HONCHO 2>/dev/null; wait $HONCHO 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do
  tandem status --json 2>/dev/null | grep -q '"id"' && break
  sleep 0.5
done
tandem status
tandem generate "$PROMPT" --max-tokens 64
