#!/usr/bin/env bash
# Set up, start `tandem serve` (the router, a worker per device, the OpenAI gateway)
# on the embedded default model, answer one prompt, stop everything.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
PROMPT=${1:-"Name three primary colors."}
LOG=${TANDEM_DEMO_LOG:-/tmp/tandem-demo.log}
tandem serve >"$LOG" 2>&1 &
SERVE=$!
# SIGTERM: serve stops its workers, gateway and router, and exits once they are gone.
trap 'kill -TERM $SERVE 2>/dev/null; wait $SERVE 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do  # up to 5 min: a first start on a loaded machine
  grep -q '^ready:' "$LOG" && break
  if ! kill -0 "$SERVE" 2>/dev/null; then
    cat "$LOG" >&2
    exit 1
  fi
  sleep 0.5
done
if ! grep -q '^ready:' "$LOG"; then
  cat "$LOG" >&2
  echo "tandem serve was not ready after 5 min (log: $LOG)" >&2
  exit 1
fi
cat "$LOG"
tandem generate "$PROMPT" --max-tokens 64
