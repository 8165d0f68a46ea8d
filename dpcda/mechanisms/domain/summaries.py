"""The exact summaries the DP domain step measures, as Beam-free combiner cores (accumulators merged by addition,
their memory set by the public grids, not the rows), and the per-batch value counts that a per-key sum combines.

Pass 1 (over the input): ``CoarseCounter`` (each numeric column's counts on its coarse cells) and
``value_count_shards`` (each value's count within one batch, keyed by (column, kind of value, shard of the value); a
value's count over the input is the sum over batches, ``merge_value_counts``). Pass 2:
``FineCounter`` (each numeric column's counts on its fine cells, given pass 1's DP ranges and spikes).
"""

from __future__ import annotations

import hashlib

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


VALUE_SHARDS = 64  # a column's values are counted in this many keys per kind (by a hash of the value), summed apart
_INT64_MAX = (1 << 63) - 1
_MIX = np.uint64(0x9E3779B97F4A7C15)


def value_key(value) -> object:
    """A value as the key it is counted under: floats with -0.0 as 0.0, integers as int."""
    if isinstance(value, float):
        return value + 0.0
    return value


def _counted_array(arr) -> pa.Array:
    """A column's array as its values are counted: one chunk, dictionary decoded, a date or timestamp as its stored
    integer, a float as float64 with -0.0 as 0.0."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if pa.types.is_dictionary(arr.type):
        arr = arr.cast(arr.type.value_type)
    t = physical_integer(arr.type)
    if t != arr.type:
        arr = arr.cast(t)
    if pa.types.is_floating(arr.type):  # float16 and float32 values are float64 values exactly
        arr = pc.add(arr.cast(pa.float64()), 0.0)  # -0.0 + 0.0 is 0.0; every other value unchanged
    return arr


def _kinds(values: pa.Array, counts: pa.Array):
    """(kind, values, counts): a column's values split by the kinds ``value_tag`` names apart ("b" booleans, "i"
    integers, "f" floats, "s" strings), each kind in one Arrow type whatever the file stored (int64, and uint64 for
    integers above int64's range, kind "u"; float64; large_string), so that the same value from batches of
    different widths is counted under one key and never two values of different kinds under one name (an int 12
    and a float 12.0 are two values; the release refuses shards whose types differ before the step:
    ``pipeline.domain.same_types``)."""
    t = values.type
    if pa.types.is_boolean(t):
        yield "b", values, counts
    elif pa.types.is_integer(t):
        if t == pa.uint64():
            big = pc.greater(values, pa.scalar(_INT64_MAX, pa.uint64()))
            yield "u", values.filter(big), counts.filter(big)
            small = pc.invert(big)
            values, counts = values.filter(small), counts.filter(small)
        yield "i", values.cast(pa.int64()), counts
    elif pa.types.is_floating(t):
        yield "f", values, counts  # float64 already (``_counted_array``)
    elif pa.types.is_string(t) or pa.types.is_large_string(t):
        yield "s", values.cast(pa.large_string()), counts
    else:  # never expected: the request takes no other type, and every shard has the first one's types
        raise TypeError(f"domain step: values of type {t} are not counted")


def value_shards(values: pa.Array, shards: int = VALUE_SHARDS) -> np.ndarray:
    """Each value's shard in range(``shards``): a hash that every worker computes alike (numbers from their bits,
    other values from ``value_tag``), so a value's counts from every batch meet under one key."""
    if pa.types.is_integer(values.type) or pa.types.is_floating(values.type):
        v = values.to_numpy(zero_copy_only=False)
        bits = v.astype(np.float64 if v.dtype.kind == "f" else np.int64).view(np.uint64)
        return ((bits * _MIX) >> np.uint64(58)).astype(np.int64) % shards  # the multiply wraps: a Fibonacci hash
    return np.array([int(value_tag(v)[:8], 16) % shards for v in values.to_pylist()], np.int64)


def value_count_shards(batch, request: DomainRequest, shards: int = VALUE_SHARDS):
    """((index of the column in ``request.counted``, kind, shard), table of ``value`` and ``count``) for every
    column, kind (``_kinds``) and shard with a value in one batch: the counts of every non-null value (floats: finite
    values only; a date or timestamp: its stored integer). A value's count over the input is the sum over batches of
    its key's (``merge_value_counts``)."""
    for j, d in enumerate(request.counted):
        vc = pc.value_counts(_counted_array(batch.column(d.name)).drop_null())
        values, counts = vc.field("values"), vc.field("counts")
        if pa.types.is_floating(values.type):
            finite = pc.is_finite(values)
            values, counts = values.filter(finite), counts.filter(finite)
        for kind, vals, cnts in _kinds(values, counts.cast(pa.int64())):
            if len(vals) == 0:
                continue
            shard = value_shards(vals, shards)
            for s in np.unique(shard):
                at = pa.array(shard == s)
                yield (j, kind, int(s)), pa.table({"value": vals.filter(at), "count": cnts.filter(at)})


def merge_value_counts(tables) -> pa.Table:
    """Tables of ``value`` and ``count`` (of one key: one Arrow type, refused otherwise) -> one with each value once
    and its counts summed."""
    t = pa.concat_tables(list(tables))
    g = t.group_by("value").aggregate([("count", "sum")])
    # one chunk each: group_by's chunks are slices of shared buffers, and pickling a slice (a combiner's accumulator
    # between stages) writes its whole buffer: 5x the data at 10^7 values
    return pa.table({"value": g.column("value"), "count": g.column("count_sum")}).combine_chunks()


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
