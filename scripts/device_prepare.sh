#!/usr/bin/env bash
# Prepares what the GPU machine of the `device` tool lacks, for scripts/device_run.sh:
#   .whl/                      cp312 x86-64 wheels of the Python packages its image does not have
#   .device-data/fashion-mnist the Fashion-MNIST IDX files (it has no Debian package and no network)
# Both are git-ignored; name them in the device call's `carry`. About 15 MiB together.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
SRC=${FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
# Versions as pinned for this project (requirements.txt) and as installed with them.
WHEELS=(dp-accounting==0.6.0 dm-tree==0.1.10 pydantic==2.14.3 pydantic-core==2.50.4 annotated-types==0.8.0
        typing-inspection==0.4.5 typing-extensions==4.16.0)
# The device image already has torch, numpy, scipy, pyarrow, matplotlib, attrs and absl-py
# (/work/.library/device/KINDS.md); scripts/device_run.sh checks every import before it runs anything.
rm -rf .whl && mkdir -p .whl
for w in "${WHEELS[@]}"; do
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any -d .whl "$w"
done
if [ ! -d "$SRC" ]; then
  echo "device_prepare: $SRC not found; run 'bash scripts/setup.sh' first (it installs dataset-fashion-mnist)" >&2
  exit 2
fi
mkdir -p .device-data/fashion-mnist
cp "$SRC"/*-ubyte* .device-data/fashion-mnist/
du -sh .whl .device-data
