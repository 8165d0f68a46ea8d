"""Shared fixtures: small generated datasets (the suite makes its own data) and the CLI runner."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
BEAM_ARGS = ["--runner=DirectRunner", "--direct_running_mode=in_memory"]


def make_dataset(n_per_class=40, num_classes=3, dim=16, seed=0):
    """Class-dependent features in [0, 1]: class k is brighter on its own stripe of features."""
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(num_classes), n_per_class)
    x = rng.uniform(0.0, 0.6, (len(y), dim)).astype(np.float32)
    for k in range(num_classes):
        stripe = slice(k * dim // num_classes, (k + 1) * dim // num_classes)
        x[y == k, stripe] += 0.4
    perm = rng.permutation(len(y))
    return np.clip(x[perm], 0, 1), y[perm].astype(np.int64)


def write_dataset(directory: Path, x, y, fmt="parquet", shards=2) -> str:
    from pipeline.prepare import write_shards

    write_shards(x, y, str(directory), fmt, shards)
    return str(directory / f"*.{fmt}")


@pytest.fixture
def small_parquet(tmp_path):
    x, y = make_dataset()
    return write_dataset(tmp_path / "in", x, y), x, y


def run_cli(*args, env=None, timeout=300):
    """Runs ``python -m pipeline.cli ARGS``; returns the CompletedProcess."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "pipeline.cli", *map(str, args)], cwd=ROOT, env=full_env,
                          capture_output=True, text=True, timeout=timeout)
