"""``dpcda prepare fashion-mnist``: Debian's IDX files -> Parquet or TFRecord shards.

Columns: ``features`` fixed_size_list<float32>[784] with pixels scaled to [0, 1], ``label`` int64.
"""

from __future__ import annotations

import gzip
import logging
import os
import struct

import numpy as np

from privacy.errors import DpcdaError
from storage.shards import write_parquet, write_tfrecord

log = logging.getLogger("dpcda.prepare")
FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
SPLITS = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}


class PrepareError(DpcdaError, RuntimeError):
    pass


def read_idx(path: str) -> np.ndarray:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as fh:
        data = fh.read()
    if len(data) < 4 or data[:2] != b"\x00\x00" or data[2] != 0x08:
        raise PrepareError(f"{path}: not an unsigned-byte IDX file")
    ndim = data[3]
    shape = struct.unpack(f">{ndim}I", data[4 : 4 + 4 * ndim])
    arr = np.frombuffer(data, np.uint8, offset=4 + 4 * ndim)
    if arr.size != int(np.prod(shape)):
        raise PrepareError(f"{path}: truncated IDX file ({arr.size} of {int(np.prod(shape))} values)")
    return arr.reshape(shape)


def load_fashion_mnist(split: str, source: str = FASHION_MNIST_DIR) -> tuple[np.ndarray, np.ndarray]:
    images, labels = (os.path.join(source, f) for f in SPLITS[split])
    for f in (images, labels):
        if not os.path.exists(f):
            raise PrepareError(f"{f}: missing; install Debian's package: apt-get install dataset-fashion-mnist")
    x = read_idx(images).reshape(-1, 28 * 28).astype(np.float32) / 255.0
    y = read_idx(labels).astype(np.int64)
    if len(x) != len(y):
        raise PrepareError(f"{source}: {len(x)} images but {len(y)} labels in split {split}")
    return x, y


def write_shards(x: np.ndarray, y: np.ndarray, directory: str, fmt: str, shards: int) -> list[str]:
    os.makedirs(directory, exist_ok=True)
    ext = "parquet" if fmt == "parquet" else "tfrecord"
    writer = write_parquet if fmt == "parquet" else write_tfrecord
    paths = []
    for i, idx in enumerate(np.array_split(np.arange(len(y)), shards)):
        path = os.path.join(directory, f"part-{i:05d}-of-{shards:05d}.{ext}")
        tmp = path + ".partial"
        writer(tmp, x[idx], y[idx])
        os.replace(tmp, path)
        paths.append(path)
    return paths


def prepare_fashion_mnist(
    out: str, fmt: str = "parquet", shards: int = 4, source: str = FASHION_MNIST_DIR, limit: int | None = None
) -> dict:
    counts = {}
    for split in ("train", "test"):
        x, y = load_fashion_mnist(split, source)
        if limit:
            x, y = x[:limit], y[:limit]
        paths = write_shards(x, y, os.path.join(out, split), fmt, shards)
        counts[split] = len(y)
        log.info(
            "prepared %s: %d rows in %d %s shards under %s", split, len(y), len(paths), fmt, os.path.join(out, split)
        )
    return counts


def load_digits_split(split: str, test_fraction: float = 0.2) -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's bundled 8 x 8 digits (1,797 rows, no download), pixels scaled to [0, 1]; a fixed, public,
    stratified split (every 5th row of each class, in the bundle's order, is a test row)."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x, y = (data.data / 16.0).astype(np.float32), data.target.astype(np.int64)
    rank = np.zeros(len(y), np.int64)
    for k in np.unique(y):
        rank[y == k] = np.arange(int((y == k).sum()))
    is_test = rank % int(round(1 / test_fraction)) == 0
    keep = is_test if split == "test" else ~is_test
    return x[keep], y[keep]


def prepare_digits(out: str, fmt: str = "parquet", shards: int = 2, limit: int | None = None) -> dict:
    counts = {}
    for split in ("train", "test"):
        x, y = load_digits_split(split)
        if limit:
            x, y = x[:limit], y[:limit]
        write_shards(x, y, os.path.join(out, split), fmt, shards)
        counts[split] = len(y)
    return counts
