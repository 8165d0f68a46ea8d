#!/usr/bin/env bash
# The test suite as CI runs it: fast default tier (slow/gpu tests are marked and deselected).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
