#!/usr/bin/env bash
# The main job on the embedded default: Fashion-MNIST (Debian package) -> Parquet shards -> DP-CDA release
# (DirectRunner, local files, fixed mode, epsilon 10, l = 16 with the low-pass post-processing: the best and steadiest
# setting our tables found under fixed) -> evaluation CNN trained on it for 5 epochs, tested on real data.
# Extra arguments go to `dpcda release` (e.g. --mode poisson --num-classes 10, --eval-epochs 3).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
DATA=${DATA:-data/fashion-mnist}
OUT=${OUT:-releases/fashion-mnist-eps10}
mkdir -p "$(dirname "$OUT")"
[ -f "$DATA/train/part-00003-of-00004.parquet" ] || .venv/bin/dpcda prepare fashion-mnist --out "$DATA" --format parquet --shards 4
.venv/bin/dpcda release --input "$DATA/train/*.parquet" --output "$OUT" --epsilon 10 --mixing-order 16 --lowpass 16 \
  --eval-input "$DATA/test/*.parquet" --eval-epochs 5 --overwrite "$@"
echo "release: $OUT (manifest: $OUT/manifest.json, evaluation: $OUT/evaluation/)" >&2
