"""Beam-free reading and writing of shards: Parquet (pyarrow) and TFRecord (``tf.train.Example``).

Rows travel as blocks: ``features`` float32 (n, d) and ``labels`` int64 (n,), never Python rows.
Paths may be local or ``gs://`` (through Beam's FileSystems, imported only when needed).
Every problem found in a shard raises ``InputError`` naming the file, the column and the row.
"""

from __future__ import annotations

import dataclasses
import io
import struct
from typing import Iterator, Optional

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dpcda.storage.paths import InputError, expand_glob, is_remote, open_file  # noqa: F401 - re-exported


@dataclasses.dataclass
class Block:
    features: np.ndarray  # float32 (n, d)
    labels: np.ndarray  # int64 (n,)
    source: str = ""
    first_row: int = 0

    def __len__(self) -> int:
        return len(self.labels)


def detect_format(path: str, declared: str = "auto") -> str:
    if declared != "auto":
        return declared
    lower = path.lower()
    if lower.endswith((".parquet", ".pq")):
        return "parquet"
    if ".tfrecord" in lower or lower.endswith(".tfr"):
        return "tfrecord"
    raise InputError(f"{path}: cannot tell the format from the name; pass --input-format")


# ---------------------------------------------------------------- Parquet


def _column_to_features(
    col: pa.ChunkedArray | pa.Array, path: str, name: str, first_row: int, width: Optional[int]
) -> np.ndarray:
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    t = arr.type
    if not (pa.types.is_fixed_size_list(t) or pa.types.is_list(t) or pa.types.is_large_list(t)):
        raise InputError(f"{path}: column '{name}' has type {t}; expected fixed_size_list<float32>")
    if not (pa.types.is_floating(t.value_type) or pa.types.is_integer(t.value_type)):
        raise InputError(f"{path}: column '{name}' holds {t.value_type}; expected float32 values")
    if arr.null_count:
        row = first_row + int(np.flatnonzero(np.asarray(arr.is_null()))[0])
        raise InputError(f"{path}: column '{name}' row {row}: missing value")
    n = len(arr)
    if pa.types.is_fixed_size_list(t):
        d = t.list_size
        values = arr.flatten().to_numpy(zero_copy_only=False)
    else:
        lengths = np.asarray(arr.value_lengths())
        d = int(width) if width is not None else (int(lengths[0]) if n else 0)
        bad = np.flatnonzero(lengths != d)
        if bad.size:
            row = first_row + int(bad[0])
            basis = "the input's width" if width is not None else f"row {first_row}'s width"
            raise InputError(f"{path}: column '{name}' row {row}: width {lengths[bad[0]]}, but {basis} is {d}")
        values = arr.flatten().to_numpy(zero_copy_only=False)
    if width is not None and d != width:
        raise InputError(f"{path}: column '{name}' row {first_row}: width {d}, but the input's width is {width}")
    return np.asarray(values, dtype=np.float32).reshape(n, d)


def _column_to_labels(col, path: str, name: str, first_row: int) -> np.ndarray:
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if arr.null_count:
        row = first_row + int(np.flatnonzero(np.asarray(arr.is_null()))[0])
        raise InputError(f"{path}: column '{name}' row {row}: missing label")
    if pa.types.is_integer(arr.type):
        vals = arr.to_numpy(zero_copy_only=False)
        if vals.dtype == np.uint64:
            big = np.flatnonzero(vals >= np.uint64(1 << 63))
            if big.size:
                raise InputError(f"{path}: column '{name}' row {first_row + int(big[0])}: label beyond the int64 range")
        return vals.astype(np.int64)
    if pa.types.is_floating(arr.type):
        vals = arr.to_numpy(zero_copy_only=False)
        bad = np.flatnonzero(~np.isfinite(vals) | (vals != np.round(vals)) | (np.abs(vals) >= 2.0**62))
        if bad.size:
            raise InputError(f"{path}: column '{name}' row {first_row + int(bad[0])}: label is not an integer")
        return vals.astype(np.int64)
    raise InputError(f"{path}: column '{name}' has type {arr.type}; expected int64")


def parquet_file(fh, path: str) -> pq.ParquetFile:
    """A Parquet reader over the open file ``fh`` of ``path`` (a remote file is read into memory first), without
    pre-buffering. pyarrow pre-buffers by default: it reads ahead on its IO threads, and a read through a Python file
    object takes the GIL when its buffer is freed there. A reader given up early (a width peek, a bad row) leaves such
    reads running; if the interpreter is exiting when one ends, that thread is killed inside C++ and the process aborts
    ("terminate called without an active exception"), turning a one-line error's exit status 2 into a crash. Reads
    here are sequential through Python anyway, so there is nothing to gain from reading ahead."""
    return pq.ParquetFile(io.BytesIO(fh.read()) if is_remote(path) else fh, pre_buffer=False)


# an input of named columns without a table: section lands here (its features column is missing)
TABLE_HINT = (
    "; a table of named columns? give --label COLUMN (the DP domain step derives the rest), or declare its label and "
    "columns in the table: section of a --config file (draft one with 'dpcda schema infer --input GLOB --label "
    "COLUMN --out table.yaml'; docs/tables.md)"
)


def read_parquet(
    path: str, features_column: str, label_column: str, batch_rows: int = 65536, width: Optional[int] = None
) -> Iterator[Block]:
    try:
        with open_file(path) as fh:
            pf = parquet_file(fh, path)
            names = pf.schema_arrow.names
            for col in (features_column, label_column):
                if col not in names:
                    hint = TABLE_HINT if col == features_column else ""
                    raise InputError(f"{path}: column '{col}' is missing (columns: {', '.join(names)}){hint}")
                if names.count(col) > 1:
                    raise InputError(
                        f"{path}: column '{col}' appears {names.count(col)} times; column names must be unique"
                    )
            row = 0
            for batch in pf.iter_batches(batch_size=batch_rows, columns=[features_column, label_column]):
                feats = _column_to_features(batch.column(features_column), path, features_column, row, width)
                labels = _column_to_labels(batch.column(label_column), path, label_column, row)
                width = feats.shape[1]
                yield Block(feats, labels, path, row)
                row += batch.num_rows
    except InputError:
        raise
    except (pa.ArrowException, OSError, ValueError) as err:
        null_row = (
            _null_fixed_list_row(path, features_column) if "Expected all lists to be of size" in str(err) else None
        )
        if null_row is not None:  # pyarrow cannot decode a null fixed_size_list row; its index is off by one
            raise InputError(f"{path}: column '{features_column}' row {null_row}: missing value") from None
        raise InputError(f"{path}: unreadable Parquet shard ({_one_line(err)})") from None


def _null_fixed_list_row(path: str, column: str) -> Optional[int]:
    """The first row of ``column`` that pyarrow cannot decode (a null fixed_size_list row), found one row at a time;
    None if every row decodes (the error was something else)."""
    row = 0
    try:
        with open_file(path) as fh:
            for batch in parquet_file(fh, path).iter_batches(batch_size=1, columns=[column]):
                if batch.column(0).null_count:
                    return row
                row += batch.num_rows
    except (pa.ArrowException, OSError, ValueError):
        return row
    return None


def _one_line(err: BaseException) -> str:
    return f"{type(err).__name__}: {' '.join(str(err).split())}"


def write_parquet(
    path: str, features: np.ndarray, labels: np.ndarray, features_column: str = "features", label_column: str = "label"
) -> None:
    table = block_table(features, labels, features_column, label_column)
    with open_file(path, "wb") as fh:
        pq.write_table(table, fh)


def block_table(
    features: np.ndarray,
    labels: np.ndarray,
    features_column: str = "features",
    label_column: str = "label",
    soft: bool = False,
) -> pa.Table:
    """Arrow table of a block. ``soft``: ``labels`` are float scores (rows, K), written as ``LABEL_soft`` beside
    their argmax in ``LABEL``."""
    features = np.ascontiguousarray(features, dtype=np.float32)
    d = features.shape[1]
    flat = pa.array(features.reshape(-1), type=pa.float32())
    labels = np.asarray(labels)
    columns = {features_column: pa.FixedSizeListArray.from_arrays(flat, d)}
    if soft != (labels.ndim == 2):
        raise ValueError(f"labels of shape {labels.shape} do not match soft={soft}")
    if soft:
        scores = np.ascontiguousarray(labels, dtype=np.float32)
        columns[label_column] = pa.array(scores.argmax(axis=1).astype(np.int64), type=pa.int64())
        columns[label_column + "_soft"] = pa.FixedSizeListArray.from_arrays(
            pa.array(scores.reshape(-1), type=pa.float32()), scores.shape[1]
        )
    else:
        columns[label_column] = pa.array(labels.astype(np.int64), type=pa.int64())
    return pa.table(columns)


def parquet_schema(
    d: int, features_column: str = "features", label_column: str = "label", soft_classes: Optional[int] = None
) -> pa.Schema:
    fields = [(features_column, pa.list_(pa.float32(), d)), (label_column, pa.int64())]
    if soft_classes:
        fields.append((label_column + "_soft", pa.list_(pa.float32(), soft_classes)))
    return pa.schema(fields)


# ---------------------------------------------------------------- TFRecord


def _masked_crc(data: bytes) -> Optional[int]:
    try:
        import google_crc32c
    except ImportError:  # the GPU image: framing is still checked, CRCs are not
        return None
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


_MAX_RECORD_BYTES = 1 << 31


def _tfrecord_frames(fh, path: str) -> Iterator[bytes]:
    index = 0
    while True:
        header = fh.read(12)
        if not header:
            return
        if len(header) < 12:
            raise InputError(f"{path}: truncated TFRecord shard at record {index} (short header)")
        (length,) = struct.unpack("<Q", header[:8])
        expect = _masked_crc(header[:8])
        if expect is not None and struct.unpack("<I", header[8:12])[0] != expect:
            raise InputError(f"{path}: corrupt TFRecord shard at record {index} (length CRC)")
        if length > _MAX_RECORD_BYTES:  # without CRCs, garbage must not turn into a huge read
            raise InputError(f"{path}: corrupt TFRecord shard at record {index} (record length {length})")
        data = fh.read(length)
        footer = fh.read(4)
        if len(data) < length or len(footer) < 4:
            raise InputError(f"{path}: truncated TFRecord shard at record {index}")
        expect = _masked_crc(data)
        if expect is not None and struct.unpack("<I", footer)[0] != expect:
            raise InputError(f"{path}: corrupt TFRecord shard at record {index} (data CRC)")
        yield data
        index += 1


def _frame(data: bytes) -> bytes:
    header = struct.pack("<Q", len(data))
    return header + struct.pack("<I", _masked_crc(header) or 0) + data + struct.pack("<I", _masked_crc(data) or 0)


def read_tfrecord(
    path: str, features_column: str, label_column: str, batch_rows: int = 65536, width: Optional[int] = None
) -> Iterator[Block]:
    try:
        yield from _read_tfrecord(path, features_column, label_column, batch_rows, width)
    except OSError as err:
        raise InputError(f"{path}: unreadable TFRecord shard ({_one_line(err)})") from None


def _read_tfrecord(
    path: str, features_column: str, label_column: str, batch_rows: int, width: Optional[int]
) -> Iterator[Block]:
    from tfrecord import example_pb2

    feats, labels, first = [], [], 0
    with open_file(path) as fh:
        for row, data in enumerate(_tfrecord_frames(fh, path)):
            try:
                ex = example_pb2.Example.FromString(data)
            except Exception:  # protobuf raises DecodeError, a plain Exception subclass
                raise InputError(f"{path}: row {row}: not a tf.train.Example") from None
            fmap = ex.features.feature
            for col in (features_column, label_column):
                if col not in fmap:
                    raise InputError(f"{path}: column '{col}' row {row}: feature missing")
            f = fmap[features_column]
            if f.WhichOneof("kind") != "float_list":
                raise InputError(
                    f"{path}: column '{features_column}' row {row}: {f.WhichOneof('kind')}, expected float_list"
                )
            values = np.asarray(f.float_list.value, np.float32)
            if width is None:
                width = values.size
            if values.size != width:
                raise InputError(
                    f"{path}: column '{features_column}' row {row}: width {values.size}, but the input's "
                    f"width is {width}"
                )
            lab = fmap[label_column]
            if lab.WhichOneof("kind") != "int64_list" or len(lab.int64_list.value) != 1:
                raise InputError(f"{path}: column '{label_column}' row {row}: expected one int64 label")
            feats.append(values)
            labels.append(lab.int64_list.value[0])
            if len(labels) == batch_rows:
                yield Block(np.stack(feats), np.asarray(labels, np.int64), path, first)
                feats, labels, first = [], [], row + 1
    if labels:
        yield Block(np.stack(feats), np.asarray(labels, np.int64), path, first)


def write_tfrecord(
    path: str, features: np.ndarray, labels: np.ndarray, features_column: str = "features", label_column: str = "label"
) -> None:
    from tfrecord import example_pb2

    with open_file(path, "wb") as fh:
        for x, y in zip(np.asarray(features, np.float32), np.asarray(labels, np.int64)):
            ex = example_pb2.Example()
            ex.features.feature[features_column].float_list.value.extend(x.tolist())
            ex.features.feature[label_column].int64_list.value.append(int(y))
            fh.write(_frame(ex.SerializeToString()))


def read_shard(
    path: str,
    fmt: str,
    features_column: str = "features",
    label_column: str = "label",
    batch_rows: int = 65536,
    width: Optional[int] = None,
) -> Iterator[Block]:
    """Blocks of one shard; ``width`` (the feature dimension of the whole input) is checked when given. A shard that
    will not read in the input's format while its name says the other one is named as such (a mixed glob)."""
    chosen = detect_format(path, fmt)
    reader = read_parquet if chosen == "parquet" else read_tfrecord
    try:
        yield from reader(path, features_column, label_column, batch_rows, width)
    except InputError as err:
        try:
            own = detect_format(path)
        except InputError:
            own = chosen
        if own != chosen and ("unreadable" in str(err) or "corrupt" in str(err)):
            names = {"parquet": "Parquet", "tfrecord": "TFRecord"}
            raise InputError(
                f"{path}: a {names[own]} file among {names[chosen]} shards (the input's format comes from its first "
                f"file's name, or --input-format); give one glob per format"
            ) from None
        raise


def finite_blocks(blocks: Iterator[Block], features_column: str = "features") -> Iterator[Block]:
    """``blocks``, each checked to hold finite features: a NaN or infinite value is refused in one line naming the
    file and row, never the value (rows that evaluate or audit a release; the release's own input is checked by
    ``transforms.read.validate_block``)."""
    for block in blocks:
        bad = ~np.isfinite(block.features)
        if bad.any():
            r = int(np.flatnonzero(bad.any(axis=1))[0])
            raise InputError(
                f"{block.source}: column '{features_column}' row {block.first_row + r}: a value is NaN or infinite "
                f"(rows that evaluate or audit a release must be finite)"
            )
        yield block


def check_finite_files(paths: list[str], fmt: str = "auto", features_column="features", label_column="label") -> None:
    """Reads ``paths`` through ``finite_blocks`` (before work: an evaluation set that would fail after the release)."""
    for _ in finite_blocks(
        (b for p in paths for b in read_shard(p, fmt, features_column, label_column)), features_column
    ):
        pass


def read_all(
    paths: list[str], fmt: str = "auto", features_column: str = "features", label_column: str = "label"
) -> Block:
    """Every row of ``paths`` in one block (evaluation and tests; the pipeline streams instead); non-finite
    features are refused (``finite_blocks``)."""
    blocks = [
        b for p in paths for b in finite_blocks(read_shard(p, fmt, features_column, label_column), features_column)
    ]
    if not blocks:
        raise InputError(f"{', '.join(paths) or '(no files)'}: zero rows")
    return Block(np.concatenate([b.features for b in blocks]), np.concatenate([b.labels for b in blocks]))
