#!/usr/bin/env bash
# The test suite as CI runs it: lint and format check, then the fast default tier (slow/gpu tests are marked and
# deselected), one pytest-xdist worker per core (give -n 0 to run in this process, e.g. for pdb).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
exec .venv/bin/python -m pytest -q -p no:cacheprovider -n auto "$@"
