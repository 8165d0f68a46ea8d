#!/usr/bin/env bash
# What a CUDA worker must show, in one run (about 6 to 8 minutes on an H100 host): the device noise path's identity
# tests, its waits for the card and the CUDA audit (pytest -m gpu), a release per mechanism on the card against the
# CPU's rows (device_release), the mixing step's rows/s drawn one chunk ahead and not, its noise share and waits
# (bench_mix_gpu), the noise module's draws/s on the card (bench_noise), and the same two on the host's CPU cores.
#
#   bash benchmarks/checks/cuda_worker.sh [LOG_DIR]     # logs to LOG_DIR (default: build/cuda_worker)
#
# Beam-free: it needs torch with CUDA and the noise path's packages (cryptography, dp-accounting, pydantic), not Beam.
# Each step has its own time limit and the script goes on past a failed step; it exits 1 if any step failed.
set -u
LOG=${1:-build/cuda_worker}
mkdir -p "$LOG"
export PYTHONUNBUFFERED=1
status=0

step() {  # step NAME SECONDS COMMAND...: run, log to LOG/NAME.log, note a failure
    local name=$1 limit=$2
    shift 2
    echo "=== $name (limit ${limit}s): $*"
    local t0=$SECONDS
    timeout "$limit" "$@" >"$LOG/$name.log" 2>&1
    local rc=$?
    grep -v "^WARNING:absl" "$LOG/$name.log" | tail -n 40
    echo "=== $name: exit $rc after $((SECONDS - t0)) s"
    [ "$rc" -eq 0 ] || status=1
}

{
    nvidia-smi -L
    python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(), torch.cuda.device_count())"
    lscpu | grep -E "^Model name|^CPU\(s\)"
} 2>&1 | tee "$LOG/machine.log"

step device_release 150 python3 -m benchmarks.checks.device_release --rows 40000 --device cuda
# a fresh machine compiles the noise kernels first: with two chunk sizes at 75 s one run printed no row (cuda_mixing_h100.md)
step bench_mix_gpu 180 python3 -m benchmarks.perf.bench_mix_gpu --n 200000 --t 200000 --l 64 --device cuda --depth 0 1 --waits
step pytest_gpu 240 python3 -m pytest -q -p no:cacheprovider -o addopts= -m gpu tests/test_noise_device.py tests/test_device.py tests/test_audit.py tests/test_rowwise.py
step bench_noise 90 python3 -m benchmarks.perf.bench_noise --device cuda --n 10000000 --repeat 3 --out "$LOG/bench_noise.md"
# the same host's CPU cores, for the worker without a card: noise threads 1 to all, and the mixing step
step bench_noise_cpu 60 python3 -m benchmarks.perf.bench_noise --host-only --threads 1 2 4 8 16 --n 4000000 --repeat 3
step bench_mix_cpu 60 python3 -m benchmarks.perf.bench_mix_gpu --n 200000 --t 50000 --l 64 --chunk-rows 16384 --device cpu
exit $status
