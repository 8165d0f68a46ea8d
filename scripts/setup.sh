#!/usr/bin/env bash
# Installs what the job and its tests need on a fresh machine: Debian's Fashion-MNIST, a venv, the pinned
# packages and this project (editable). Idempotent: a stamp skips the pip step when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  echo "setup: installing Debian's dataset-fashion-mnist" >&2
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq dataset-fashion-mnist >/dev/null
fi
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=".venv/.installed-$(cat requirements.txt requirements-dev.txt setup.py | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  echo "setup: installing Python packages into .venv" >&2
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -r requirements-dev.txt
  .venv/bin/python -m pip install -q --no-deps -e .
  rm -f .venv/.installed-*; touch "$stamp"
fi
