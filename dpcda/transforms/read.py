"""ReadShards: file paths -> validated ``Block``s (features float32 (n, d), labels int64)."""

from __future__ import annotations

import logging

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics

from dpcda.storage.shards import Block, InputError, read_shard
from dpcda.storage.tables import read_table_parquet

log = logging.getLogger(__name__)
# Without --num-classes, K = max label + 1; labels at or above this are refused as corrupt.
MAX_INFERRED_CLASSES = 1 << 16


def validate_block(
    block: Block, *, bounds, out_of_bounds: str, num_classes, features_column: str, label_column: str
) -> tuple[Block, int]:
    """Check a block before any noise is drawn; returns the (clipped) block and the clipped count."""
    x, y, src = block.features, block.labels, block.source
    bad = ~np.isfinite(x)
    if bad.any():  # values are private: the message names the rule, never the value
        r = int(np.flatnonzero(bad.any(axis=1))[0])
        raise InputError(
            f"{src}: column '{features_column}' row {block.first_row + r}: a value is NaN, infinite or "
            f"beyond the float32 range"
        )
    lo, hi = bounds
    outside = (x < lo) | (x > hi)
    n_out = int(outside.sum())
    if n_out and out_of_bounds == "refuse":
        r = int(np.flatnonzero(outside.any(axis=1))[0])
        last = block.first_row + len(x) - 1
        raise InputError(
            f"{src}: column '{features_column}' row {block.first_row + r}: a value lies outside "
            f"feature_bounds [{lo:g}, {hi:g}] (rows {block.first_row}-{last} hold such values; "
            f"out_of_bounds=refuse, or pass --out-of-bounds clip)"
        )
    if n_out:
        x = np.clip(x, lo, hi)
    neg = np.flatnonzero(y < 0)
    if neg.size:
        raise InputError(f"{src}: column '{label_column}' row {block.first_row + int(neg[0])}: negative label")
    if num_classes is not None:
        big = np.flatnonzero(y >= num_classes)
        if big.size:
            raise InputError(
                f"{src}: column '{label_column}' row {block.first_row + int(big[0])}: label >= "
                f"num_classes {num_classes}"
            )
    else:  # K is inferred as max label + 1: a stray huge label must not size the class histogram
        big = np.flatnonzero(y >= MAX_INFERRED_CLASSES)
        if big.size:
            raise InputError(
                f"{src}: column '{label_column}' row {block.first_row + int(big[0])}: label >= "
                f"{MAX_INFERRED_CLASSES} with no --num-classes; pass --num-classes"
            )
    return Block(x, y, src, block.first_row), n_out


class _ReadShardFn(beam.DoFn):
    def __init__(
        self, fmt, features_column, label_column, bounds, out_of_bounds, num_classes, batch_rows, width=None, table=None
    ):
        self.fmt, self.fc, self.lc, self.width, self.table = fmt, features_column, label_column, width, table
        self.checks = dict(
            bounds=bounds,
            out_of_bounds=out_of_bounds,
            num_classes=num_classes,
            features_column=features_column,
            label_column=label_column,
        )
        self.batch_rows = batch_rows
        self.rows_read = Metrics.counter("dpcda", "rows_read")
        self.values_clipped = Metrics.counter("dpcda", "values_clipped_to_bounds")
        self.rows_rejected = Metrics.counter("dpcda", "rows_rejected")

    def process(self, path):
        if self.table is not None:
            blocks = read_table_parquet(path, self.table, self.batch_rows)
        else:
            blocks = read_shard(path, self.fmt, self.fc, self.lc, self.batch_rows, self.width)
        for block in blocks:
            try:
                block, clipped = validate_block(block, **self.checks)
            except InputError:
                self.rows_rejected.inc(1)
                raise
            if clipped:
                log.warning("%s: %d feature values outside the declared bounds were clipped", path, clipped)
                self.values_clipped.inc(clipped)
            self.rows_read.inc(len(block))
            yield block


class ReadShards(beam.PTransform):
    """PBegin -> Block: reads and validates every shard in ``files`` (all of feature width ``width``, if given).
    With ``table`` (a ``schemas.table.TableSchema``), shards are Parquet tables, encoded by it."""

    def __init__(
        self,
        files,
        *,
        fmt="auto",
        features_column="features",
        label_column="label",
        bounds=(0.0, 1.0),
        out_of_bounds="clip",
        num_classes=None,
        batch_rows=16384,
        width=None,
        table=None,
    ):
        super().__init__()
        self.files = list(files)
        self.fn = _ReadShardFn(
            fmt, features_column, label_column, bounds, out_of_bounds, num_classes, batch_rows, width, table
        )

    def expand(self, pbegin):
        return (
            pbegin
            | "ListShards" >> beam.Create(self.files)
            | "SpreadShards" >> beam.Reshuffle()
            | "ReadAndValidate" >> beam.ParDo(self.fn)
        )
