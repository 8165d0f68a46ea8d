#!/usr/bin/env bash
# The README's first command as a new user meets it: a fresh clone of this repository's HEAD, then
# scripts/release_fashion_mnist.sh three times (the first run includes the set-up: venv, pip, apt if needed).
# Prints one row per run: wall seconds, release seconds, evaluation seconds, accuracy, epsilon.
#   bash benchmarks/perf/first_command.sh [RUNS]
set -euo pipefail
RUNS=${1:-3}
SRC="$(cd "$(dirname "$0")/../.." && pwd)"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
git clone -q "$SRC" "$WORK/clone"
cd "$WORK/clone"
echo "| run | wall s | release s | evaluation s | accuracy | epsilon |"
echo "|---|---|---|---|---|---|"
for i in $(seq 1 "$RUNS"); do
  start=$(date +%s.%N)
  bash scripts/release_fashion_mnist.sh > "$WORK/run$i.log" 2>&1 || { tail -5 "$WORK/run$i.log" >&2; exit 1; }
  wall=$(echo "$(date +%s.%N) - $start" | bc)
  rel=$(grep -o 'stage=pipeline .*seconds=[0-9.]*' "$WORK/run$i.log" | grep -o '[0-9.]*$')
  ev=$(grep -o 'stage=evaluate real_test_accuracy .*seconds=[0-9.]*' "$WORK/run$i.log" | grep -o '[0-9.]*$')
  summary=$(tail -2 "$WORK/run$i.log" | grep '^{')
  acc=$(echo "$summary" | python3 -c 'import json, sys; print("%.4f" % json.load(sys.stdin)["accuracy"])')
  eps=$(echo "$summary" | python3 -c 'import json, sys; print("%.3f" % json.load(sys.stdin)["epsilon"])')
  printf '| %d | %.0f | %s | %s | %s | %s |\n' "$i" "$wall" "$rel" "$ev" "$acc" "$eps"
done
