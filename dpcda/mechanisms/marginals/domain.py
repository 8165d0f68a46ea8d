"""Codes: every column of a table (the label last) as integer codes on public bins, and codes back to encoded rows."""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Optional

import numpy as np

from dpcda.privacy.noise import NoiseStream
from dpcda.schemas.table import encode_numeric


@dataclasses.dataclass(frozen=True)
class Domain:
    """The public code domain: column names (the label last) and how many codes each takes."""

    names: tuple[str, ...]
    sizes: tuple[int, ...]
    bins: int

    @property
    def pairs(self) -> tuple[tuple[int, int], ...]:
        return tuple(itertools.combinations(range(len(self.names)), 2))

    @property
    def cells(self) -> int:
        one = sum(self.sizes)
        return one + sum(self.sizes[a] * self.sizes[b] for a, b in self.pairs)


def _values(col, bins: int) -> int:
    """Codes of a column's values (its null, where nullable, is the next code): its categories (and other bucket),
    0/1, its spikes and bins, or its spikes and ``bins`` equal bins (no ``edges``)."""
    codes = col.codes
    return int(bins) + len(getattr(col, "spikes", None) or []) if codes is None else codes


def domain_of(schema, bins: int) -> Domain:
    """Codes per column of the table schema ``schema`` at ``bins`` numeric bins (a null is one more code)."""
    names, sizes = [], []
    for col in schema.columns:
        names.append(col.name)
        sizes.append(_values(col, bins) + int(col.nullable))
    names.append(schema.label.name)
    sizes.append(schema.num_classes)
    return Domain(tuple(names), tuple(sizes), int(bins))


def codes_of(x01: np.ndarray, labels: np.ndarray, schema, bins: int) -> np.ndarray:
    """(n, columns + 1) int64 codes of encoded rows (``storage.tables.encode_batch``'s layout) and class indices."""
    x = np.asarray(x01)
    n = len(x)
    out = np.empty((n, len(schema.columns) + 1), np.int64)
    for j, (col, at) in enumerate(schema.layout()):
        width = col.width - int(col.nullable)
        if col.kind == "categorical":
            code = np.argmax(x[:, at : at + width], axis=1) if n else np.zeros(0, np.int64)
        elif col.kind == "boolean":
            code = (x[:, at] > 0.5).astype(np.int64)
        else:
            code = numeric_codes(col, x[:, at].astype(np.float32), bins)
        if col.nullable:
            code = np.where(x[:, at + col.width - 1] > 0.5, _values(col, bins), code)
        out[:, j] = code
    out[:, -1] = np.asarray(labels, np.int64)
    return out


def encoded(col, values: np.ndarray) -> np.ndarray:
    """Numeric values of ``col`` as ``storage.tables.encode_batch`` encodes them (``schemas.table.encode_numeric``)."""
    return encode_numeric(col, values)


def numeric_codes(col, x32: np.ndarray, bins: int) -> np.ndarray:
    """Codes of a numeric column's encoded float32 values: spike i where a value's encoding is spike i's (a value
    within float32 rounding of a spike counts as it), else len(spikes) + its bin (``encoded_edges``); a column with
    spikes and no bins: the nearest spike."""
    spikes = encoded(col, col.spikes) if col.spikes else np.zeros(0, np.float32)
    edges = encoded_edges(col, bins) if col.edges is None or col.edges else None
    if edges is not None:
        code = len(spikes) + np.searchsorted(edges[1:-1], x32, side="right")
    else:  # spikes only
        right = np.clip(np.searchsorted(spikes, x32), 1, len(spikes) - 1) if len(spikes) > 1 else np.zeros(len(x32))
        right = right.astype(np.int64)
        left = np.maximum(right - 1, 0)
        closer = np.abs(x32 - spikes[left]) <= np.abs(spikes[right] - x32)
        code = np.where(closer, left, right)
    if len(spikes):
        at = np.clip(np.searchsorted(spikes, x32), 0, len(spikes) - 1)
        code = np.where(spikes[at] == x32, at, code)
    return code.astype(np.int64)


def encoded_edges(col, bins: int) -> np.ndarray:
    """The ``bins + 1`` edges of a numeric column's equal bins, ``numpy.linspace(lower, upper, bins + 1)`` in its
    values, encoded (``encoded``). A value v lies in bin b where edge b <= v < edge b + 1 (the last bin takes
    ``upper``); as the encoding is monotone, its code (``searchsorted(edges[1:-1], encoded v, "right")``) is b for every
    v on an edge or further than float32's rounding from one: ``evaluation.table_metrics``'s bins. Read off the
    encoding as ``floor(x * bins)``, a value on an edge whose encoding rounds down (70 in [0, 200]: 0.35 ->
    0.34999999) would fall into the bin below. A column with ``edges`` (declared or DP-derived): those, encoded."""
    if col.edges:
        return encoded(col, np.asarray(col.edges, np.float64))
    return encoded(col, np.linspace(col.lower, col.upper, bins + 1))


MAX_INTEGER_VALUES = 1 << 20  # an integer column with more values in its bounds draws inside its bin, then rounds


def integer_bins(col, bins: int) -> Optional[list]:
    """For an integer column: per bin, the encoded values of the integers in it (an empty bin gets the integer
    nearest its middle), each computed as ``storage.tables.encode_batch`` encodes it, so a decoded value rounds back to
    that integer and lies in that bin; None where the bounds hold more than MAX_INTEGER_VALUES integers."""
    lo, hi = math.ceil(col.lower), math.floor(col.upper)
    if hi - lo + 1 > MAX_INTEGER_VALUES:
        return None
    ints = np.arange(lo, hi + 1, dtype=np.float64)
    if col.spikes:  # a spike is a code of its own: no bin draws it
        ints = ints[~np.isin(ints, np.asarray(col.spikes, np.float64))]
    enc = encoded(col, ints)
    if enc.size == 0:
        enc = encoded(col, np.arange(lo, hi + 1, dtype=np.float64))
    edges = encoded_edges(col, bins)
    bins = len(edges) - 1
    code = np.searchsorted(edges[1:-1], enc, side="right")
    out = []
    for b in range(bins):
        inside = enc[code == b]
        if inside.size == 0:
            middle = (float(edges[b]) + float(edges[b + 1])) / 2
            inside = enc[[int(np.argmin(np.abs(enc.astype(np.float64) - middle)))]]
        out.append(inside)
    return out


def inside_bins(codes: np.ndarray, u: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Encoded float32 values drawn uniformly inside bins ``codes`` (``u``: uniforms in [0, 1)): edge b + u (edge b + 1
    - edge b), kept below edge b + 1 where float32 rounding would reach it (the last bin reaches 1); a bin whose edges
    are one float32 (bounds too narrow for their magnitude: it holds no value) gets its edge."""
    lo, hi = edges[codes].astype(np.float64), edges[codes + 1].astype(np.float64)
    x = (lo + u * (hi - lo)).astype(np.float32)
    below = np.nextafter(edges[codes + 1], np.float32(-np.inf))
    last = codes == len(edges) - 2
    x = np.where(last, np.minimum(x, np.float32(1.0)), np.minimum(x, below))
    return np.where(hi > lo, x, edges[codes]).astype(np.float32)


def rows_of(
    codes: np.ndarray, schema, bins: int, stream: NoiseStream, integers: frozenset = frozenset()
) -> tuple[np.ndarray, np.ndarray]:
    """Encoded float32 rows (the layout ``storage.tables.decode_rows`` reads) and labels of codes: a category one-hot,
    a boolean 0/1, a numeric code a value drawn uniformly inside its bin with ``stream``'s uniforms (a column named in
    ``integers``: one of the integers inside it, uniformly), a null code the null indicator."""
    n = len(codes)
    x = np.zeros((n, schema.encoded_width), np.float32)
    for j, (col, at) in enumerate(schema.layout()):
        c = np.asarray(codes[:, j], np.int64)
        null = c == _values(col, bins) if col.nullable else np.zeros(n, bool)
        rows = np.flatnonzero(~null)
        if col.kind == "categorical":
            x[rows, at + c[rows]] = 1.0
        elif col.kind == "boolean":
            x[rows, at] = c[rows]
        else:
            spikes = len(col.spikes or ())
            if spikes:  # a spike's code: its encoding, which decodes to the spike exactly (storage.tables)
                is_spike = rows[c[rows] < spikes]
                x[is_spike, at] = encoded(col, np.asarray(col.spikes, np.float64))[c[is_spike]]
                rows = rows[c[rows] >= spikes]
            b = c[rows] - spikes
            table = integer_bins(col, bins) if col.name in integers and rows.size else None
            if table is None:
                x[rows, at] = inside_bins(b, stream.uniform(rows.size), encoded_edges(col, bins))
            else:
                for k in np.unique(b):
                    at_b = rows[b == k]
                    x[at_b, at] = table[k][stream.uniform_int(len(table[k]), at_b.size)]
        if col.nullable:
            x[null, at + col.width - 1] = 1.0
    return x, np.asarray(codes[:, -1], np.int64)
