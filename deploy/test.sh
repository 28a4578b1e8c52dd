#!/usr/bin/env bash
# Set up and run the whole test suite (unit, real-process integration, parity).
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/setup.sh
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
