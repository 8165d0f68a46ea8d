#!/usr/bin/env bash
# Runs one of our Python modules on the GPU machine of the `device` tool (its image has torch but not
# pydantic or dp-accounting; nothing can be fetched there). Prepare once here with scripts/device_prepare.sh, then:
#   run(command="bash scripts/device_run.sh benchmarks.reproduce_table2 --source .device-data/fashion-mnist --runs 3 --resume",
#       carry=[".whl", ".device-data"])
# Results the module writes under benchmarks/results/ during this call (at most 7) and log.txt come back in $OUT;
# copy them into benchmarks/results/ here, so a later call with --resume continues where this one stopped.
# DEVICE_BUDGET_S (default 540) stops the module in time for the copy: keep it under the call's limit_s (600 s at
# most, less when little device time is left), or finished cells are lost with the machine.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
: "${OUT:?OUT is set by the device tool}"
if [ -z "${DEVICE_SKIP_INSTALL:-}" ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "device_run: installing .whl failed (carry it; see scripts/device_prepare.sh)" >&2; exit 2; }
fi
[ -d /tmp/site ] && export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
"$PY" -c "import torch, numpy, scipy, pyarrow, matplotlib, attr, absl, pydantic, dp_accounting" \
  || { echo "device_run: a package is missing (see scripts/device_prepare.sh)" >&2; exit 2; }
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
marker=$(mktemp)
trap 'rm -f "$marker"' EXIT
timeout "${DEVICE_BUDGET_S:-540}" "$PY" -m "$@" 2>&1 | tee "$OUT/log.txt"
rc=${PIPESTATUS[0]}
[ "$rc" = 124 ] && echo "device_run: stopped after ${DEVICE_BUDGET_S:-540} s; rerun with --resume to continue" | tee -a "$OUT/log.txt"
find benchmarks/results -type f -newer "$marker" | head -7 | while read -r f; do cp "$f" "$OUT/"; done
ls "$OUT"
exit "$rc"
