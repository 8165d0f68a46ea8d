"""Shared fixtures: small generated datasets (the suite makes its own data) and the CLI runner."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]

# scripts/test.sh runs one pytest-xdist worker per core: each worker, and the CLI processes it starts, then takes its
# share of the cores' threads instead of all of them (set before any test imports torch; an explicit setting wins).
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _WORKERS)))
BEAM_ARGS = ["--runner=DirectRunner", "--direct_running_mode=in_memory"]


def _honour_generation_preconditions(server_module, objects_module):
    """gcp-storage-emulator ignores ifGenerationMatch; real GCS answers 412 when it does not hold. This wraps the
    emulator's upload handler so that it does too (the publish protocol's compare-and-swap relies on it)."""
    import threading
    from http import HTTPStatus

    original = objects_module.insert
    lock = threading.Lock()

    def insert(request, response, storage, *args, **kwargs):
        want = request.query.get("ifGenerationMatch")
        with lock:
            if want:
                if "name" in request.query:
                    name = request.query["name"][0]
                elif isinstance(request.data, dict) and "meta" in request.data:
                    name = request.data["meta"].get("name")
                else:
                    name = (request.data or {}).get("name")
                current = storage.objects.get(request.params["bucket_name"], {}).get(name)
                generation = int(current["generation"]) if current else 0
                if int(want[0]) != generation:
                    response.status = HTTPStatus.PRECONDITION_FAILED
                    response.json({"error": {"code": 412, "message": "Precondition Failed"}})
                    return None
            return original(request, response, storage, *args, **kwargs)

    for _, handlers in server_module.HANDLERS:
        for method, handler in list(handlers.items()):
            if handler is original:
                handlers[method] = insert
    objects_module.insert = insert
    return original


@pytest.fixture
def gcs(monkeypatch):
    """A local GCS emulator (bucket 'lake') that honours generation preconditions; yields 'gs://lake'."""
    import socket

    emulator = pytest.importorskip("gcp_storage_emulator.server")
    from gcp_storage_emulator.handlers import objects

    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        port = sock.getsockname()[1]
    original = _honour_generation_preconditions(emulator, objects)
    server = emulator.create_server("localhost", port, in_memory=True, default_bucket="lake")
    server.start()
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://localhost:{port}")
    # Offline, Beam's credential lookup stalls ~25 s; the emulator takes anonymous requests.
    import apache_beam.internal.gcp.auth as auth

    monkeypatch.setattr(auth, "get_service_credentials", lambda *a, **k: None)
    try:
        yield "gs://lake"
    finally:
        server.stop()
        for _, handlers in emulator.HANDLERS:
            for method, handler in list(handlers.items()):
                if handler is objects.insert:
                    handlers[method] = original
        objects.insert = original


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
    from dpcda.pipeline.prepare import write_shards

    write_shards(x, y, str(directory), fmt, shards)
    return str(directory / f"*.{fmt}")


@pytest.fixture
def small_parquet(tmp_path):
    x, y = make_dataset()
    return write_dataset(tmp_path / "in", x, y), x, y


def run_cli(*args, env=None, timeout=300):
    """Runs ``python -m dpcda.pipeline.cli ARGS``; returns the CompletedProcess."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "dpcda.pipeline.cli", *map(str, args)],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def valid_manifest(sigma_x=1.0, mode="fixed") -> dict:
    """A small manifest that validates against the model (for tests that need a release of ours on disk)."""
    return {
        "created_at": "2024-01-01T00:00:00+00:00",
        "software": {"version": "0", "python": "3", "torch": "2", "dp_accounting": "0"},
        "input": {
            "pattern": "x",
            "format": "parquet",
            "features_column": "x",
            "label_column": "y",
            "feature_dim": 4,
        },
        "mechanism": {
            "mode": mode,
            "sampling": "s",
            "mixing_order": 2,
            "clip": 1.0,
            "sigma_x": sigma_x,
            "sigma_y": 0.0,
            "noise_multiplier": 1.0,
            "num_classes": 2,
            "samples_total": 4,
            "samples_per_class": 2,
            "sampling_rates": [0.5, 0.5],
            "chunk_rows": 4096,
        },
        "normalization": {"method": "dp", "feature_bounds": [0, 1], "out_of_bounds": "clip", "min_std": 1e-3},
        "privacy": {
            "epsilon": 4.0,
            "delta": 1e-5,
            "target_epsilon": 4.0,
            "accountant": "rdp",
            "neighbouring_relation": "r",
            "composition": "c",
            "components": {},
            "end_to_end_dp": True,
            "reproducible_seed": False,
            "caveats": [],
            "delta_breakdown": {"accountant": 1e-5},
            "noise": {"generator": "g", "sampler": "s", "grids": {}},
        },
        "output": {"rows": 4, "files": [{"path": "synthetic/part-00000-of-00001.parquet", "rows": 4, "sha256": "0"}]},
    }
