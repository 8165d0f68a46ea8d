"""The exact summaries the DP domain step measures, as Beam-free combiner cores (accumulators merged by addition,
their memory set by the public grids, not the rows), and the per-batch value counts that a per-key sum combines.

Pass 1 (over the input): ``CoarseCounter`` (each numeric column's counts on its coarse cells) and ``value_counts``
((column, value) -> count within one batch; the counts of a value over the input are the sum over batches). Pass 2:
``FineCounter`` (each numeric column's counts on its fine cells, given pass 1's DP ranges and spikes).
"""

from __future__ import annotations

import hashlib
import math
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dpcda.mechanisms.domain.grid import Fine
from dpcda.mechanisms.domain.request import DomainRequest
from dpcda.schemas.table import physical_integer


def numeric_values(arr) -> np.ndarray:
    """The finite values of a numeric column as float64 (nulls and NaN/inf left out: a release refuses those when it
    reads the rows); a date or timestamp as the integer it is stored as."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    t = physical_integer(arr.type)
    if t != arr.type:
        arr = arr.cast(t)
    v = arr.drop_null().cast(pa.float64(), safe=False).to_numpy(zero_copy_only=False)
    return v[np.isfinite(v)]


class _FlatCounter:
    """Count arrays of several columns as one flat int64 accumulator (merged by addition)."""

    def __init__(self, sizes: list[int]):
        self.offsets = tuple(int(o) for o in np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]))

    def create(self) -> np.ndarray:
        return np.zeros(self.offsets[-1], np.int64)

    def merge(self, accs) -> np.ndarray:
        return np.sum([np.asarray(a, np.int64) for a in accs], axis=0, dtype=np.int64)

    def column(self, acc: np.ndarray, j: int) -> np.ndarray:
        return acc[self.offsets[j] : self.offsets[j + 1]]


class CoarseCounter(_FlatCounter):
    """Every derived numeric column's counts on its coarse cells (``grid.Coarse``)."""

    def __init__(self, request: DomainRequest):
        self.columns = request.numeric
        super().__init__([d.coarse.cells for d in self.columns])

    def add(self, acc: np.ndarray, batch) -> np.ndarray:
        for j, d in enumerate(self.columns):
            cells = d.coarse.index(numeric_values(batch.column(d.name)))
            self.column(acc, j)[:] += np.bincount(cells, minlength=d.coarse.cells)
        return acc


class FineCounter(_FlatCounter):
    """Every derived numeric column's counts on its fine cells (``grid.Fine``: inside its DP range, its DP spikes
    left out)."""

    def __init__(self, request: DomainRequest, fines: dict):
        self.columns = request.numeric
        self.fines = [fines[d.name] for d in self.columns]
        super().__init__([f.cells for f in self.fines])

    def add(self, acc: np.ndarray, batch) -> np.ndarray:
        for j, (d, fine) in enumerate(zip(self.columns, self.fines)):
            cells = fine.index(numeric_values(batch.column(d.name)))
            self.column(acc, j)[:] += np.bincount(cells[cells >= 0], minlength=fine.cells)
        return acc


def value_key(value) -> object:
    """A value as the key it is counted under: floats with -0.0 as 0.0, integers as int."""
    if isinstance(value, float):
        return value + 0.0
    return value


def value_counts(batch, request: DomainRequest) -> Iterator[tuple[tuple[int, object], int]]:
    """((index of the column in ``request.counted``, value), count) for every non-null value of every derived column
    in one batch (floats: finite values only; a date or timestamp: its stored integer)."""
    for j, d in enumerate(request.counted):
        arr = batch.column(d.name)
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        if pa.types.is_dictionary(arr.type):
            arr = arr.cast(arr.type.value_type)
        t = physical_integer(arr.type)
        if t != arr.type:
            arr = arr.cast(t)
        counts = pc.value_counts(arr.drop_null())
        for value, n in zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist()):
            if isinstance(value, float) and not math.isfinite(value):
                continue
            yield (j, value_key(value)), int(n)


def value_tag(value) -> str:
    """A collision-free name of a value for its noise stream (the stream path's elements are joined with '/', so the
    value itself, which may hold one, is never put in it)."""
    if isinstance(value, bool):
        raw = b"b" + bytes([value])
    elif isinstance(value, int):
        raw = b"i" + str(value).encode()
    elif isinstance(value, float):
        raw = b"f" + value.hex().encode()
    else:
        raw = b"s" + str(value).encode("utf-8")
    return hashlib.blake2b(raw, digest_size=16).hexdigest()


def fine_grids(request: DomainRequest, ranges: dict, spikes: dict) -> dict:
    """Column name -> its ``grid.Fine`` inside its DP range, its DP spikes left out."""
    return {
        d.name: Fine(ranges[d.name][0], ranges[d.name][1], d.integer, tuple(spikes.get(d.name, ())))
        for d in request.numeric
    }
