"""Recorded releases: the same ``--seed`` must give the same rows and manifest, whatever the code's organisation.

``CASES`` are small real releases through the CLI (Beam's DirectRunner), one per mechanism and mode. ``fingerprint``
reduces one to the SHA-256 of its rows (features, labels and label scores, in part order) and its manifest with the
fields that name a run (time, paths, versions) taken out. ``tests/recorded/golden_rows.json`` holds them as recorded at
git revision 507453d:

    python -m tests.golden --tree DIR --out tests/recorded/golden_rows.json   # DIR: a checkout of that revision

(``benchmarks.paired.revision_tree`` checks a revision out and gives it the ``dpcda/`` layout.)
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

SEED = 7
# manifest fields that name this run rather than describe the release (each may differ between two identical runs)
RUN_FIELDS = (("created_at",), ("software",), ("run",), ("input", "pattern"), ("output", "path"), ("output", "files"))
CASES = {
    "dpcda-fixed": ["--epsilon", "10", "--mixing-order", "4"],
    "dpcda-poisson": [
        "--epsilon",
        "10",
        "--mixing-order",
        "4",
        "--mode",
        "poisson",
        "--num-classes",
        "3",
        "--soft-labels",
    ],
    "dpmix": ["--mechanism", "dpmix", "--epsilon", "20", "--mixing-order", "4", "--num-classes", "3"],
    "local": ["--mechanism", "local", "--epsilon", "10"],
    "randproj": ["--mechanism", "randproj", "--epsilon", "10", "--projection-dim", "8"],
    "p3gm": [
        "--mechanism",
        "p3gm",
        "--epsilon",
        "10",
        "--num-classes",
        "3",
        "--p3gm-latent-dim",
        "4",
        "--p3gm-components",
        "2",
        "--p3gm-hidden",
        "16",
        "--p3gm-epochs",
        "1",
        "--p3gm-batch",
        "40",
    ],  # fmt: skip
}


def dataset():
    """120 rows of 16 features in [0, 1], three classes (tests.conftest.make_dataset's recipe, fixed here)."""
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(3), 40)
    x = rng.uniform(0.0, 0.6, (len(y), 16)).astype(np.float32)
    for k in range(3):
        x[y == k, k * 16 // 3 : (k + 1) * 16 // 3] += 0.4
    perm = rng.permutation(len(y))
    return np.clip(x[perm], 0, 1), y[perm].astype(np.int64)


def write_input(folder: str) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    x, y = dataset()
    os.makedirs(folder, exist_ok=True)
    for part, rows in enumerate(np.array_split(np.arange(len(y)), 2)):
        feats = pa.FixedSizeListArray.from_arrays(pa.array(x[rows].ravel(), pa.float32()), x.shape[1])
        table = pa.table({"features": feats, "label": pa.array(y[rows], pa.int64())})
        pq.write_table(table, os.path.join(folder, f"part-{part:05d}-of-00002.parquet"))
    return os.path.join(folder, "*.parquet")


def run_case(name: str, tree: str, work: str) -> str:
    """Releases case ``name`` with the code of source tree ``tree``; returns the release directory. The run's working
    directory is a fresh folder and the paths are relative to it: local perturbation keys each block's noise by its
    shard's path, so the same rows need the same path."""
    folder = os.path.join(work, name)
    os.makedirs(folder)
    write_input(os.path.join(folder, "in"))
    cmd = [sys.executable, "-m", "dpcda.pipeline.cli", "release", "--input", "in/*.parquet", "--output", "out"]
    cmd += ["--seed", str(SEED), *CASES[name], "--runner=DirectRunner", "--direct_running_mode=in_memory"]
    env = {**os.environ, "PYTHONPATH": tree}
    res = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        raise RuntimeError(f"{name}: release failed:\n{res.stderr[-3000:]}")
    return os.path.join(folder, "out")


def fingerprint(out: str) -> dict:
    """{'rows': sha256 of the released rows (every column, as bytes) sorted, 'manifest': the manifest less
    RUN_FIELDS}. Sorted: the runner decides which part a row lands in and in what order; the rows themselves are
    fixed by the seed."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tables = [pq.read_table(p) for p in sorted(glob.glob(os.path.join(out, "synthetic", "*.parquet")))]
    table = pa.concat_tables(tables)
    columns = []
    for name in table.column_names:
        col = table.column(name).combine_chunks()
        values = col.flatten() if pa.types.is_fixed_size_list(col.type) else col
        values = np.asarray(values.to_numpy(zero_copy_only=False)).reshape(table.num_rows, -1)
        columns.append(np.ascontiguousarray(values).view(np.uint8).reshape(table.num_rows, -1))
    rows = np.concatenate(columns, axis=1) if columns else np.zeros((0, 0), np.uint8)
    rows = rows[np.lexsort(rows.T[::-1])] if len(rows) else rows
    h = hashlib.sha256(",".join(table.column_names).encode())
    h.update(rows.tobytes())
    with open(os.path.join(out, "manifest.json")) as fh:
        manifest = json.load(fh)
    for path in RUN_FIELDS:
        node = manifest
        for key in path[:-1]:
            node = node.get(key, {})
        node.pop(path[-1], None)
    return {"rows": h.hexdigest(), "manifest": manifest}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="golden-") as work:
        found = {name: fingerprint(run_case(name, os.path.abspath(args.tree), work)) for name in CASES}
    with open(args.out, "w") as fh:
        json.dump(found, fh, indent=1, sort_keys=True)
        fh.write("\n")


if __name__ == "__main__":
    main()
