"""Table metrics an analyst reads: every column and every pair of columns (the label included), and the base rate.

Both tables are discretised by the release's PUBLIC schema only: a categorical or boolean column by its declared
values, a numeric column into ``BINS`` equal bins of its declared [lower, upper] (values outside are clipped, as the
release clips them), and a null is a value of its own. Then:

- one-way: per column, the total variation distance (TVD) between the real and synthetic value frequencies;
- two-way: per pair of columns, the TVD between their joint frequencies, every pair and the label's pairs apart
  (what a cross-tab by the label shows);
- base rate: the label's class frequencies, real and synthetic, and the largest gap;
- ``fidelity``: one summary score in [0, 1], 1 - the mean of the mean one-way and the mean two-way TVD.

TVD is half the L1 distance of two frequency vectors: 0 for the same distribution, 1 for disjoint ones.
"""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow as pa

from dpcda.schemas.table import TableSchema

BINS = 20


def codes(table: pa.Table, schema: TableSchema) -> dict[str, tuple[np.ndarray, int]]:
    """Column name -> (int codes of its rows, the number of codes), by the public schema (label last)."""
    out = {}
    for col in (*schema.columns, schema.label):
        values = table.column(col.name).to_pylist()
        kind = getattr(col, "kind", "categorical")
        if kind == "numeric":
            edges = np.linspace(col.lower, col.upper, BINS + 1)[1:-1]
            x = np.array([np.nan if v is None else float(v) for v in values])
            c = np.searchsorted(edges, np.clip(x, col.lower, col.upper), side="right")
            out[col.name] = (np.where(np.isnan(x), BINS, c).astype(np.int64), BINS + 1)
        elif kind == "boolean":  # stored as bool or as the integers 0 and 1 (False == 0, True == 1)
            c = [2 if v is None else {False: 0, True: 1}.get(v, 3) for v in values]
            out[col.name] = (np.asarray(c, np.int64), 4)  # + null, + a value outside 0 and 1
        else:
            cats = list(col.categories)
            index = {repr(v): k for k, v in enumerate(cats)}
            null = len(cats)
            c = [null if v is None else index.get(repr(v), null + 1) for v in values]
            out[col.name] = (np.asarray(c, np.int64), null + 2)  # + null, + a value outside the declared ones
    return out


def tvd(a: np.ndarray, b: np.ndarray, size: int) -> float:
    """Total variation distance between the frequencies of two code arrays over range(size)."""
    fa = np.bincount(a, minlength=size) / max(len(a), 1)
    fb = np.bincount(b, minlength=size) / max(len(b), 1)
    return float(0.5 * np.abs(fa - fb).sum())


def table_metrics(real: pa.Table, synth: pa.Table, schema: TableSchema) -> dict:
    """One-way and two-way distances (label pairs apart), the base rate, and the fidelity score."""
    cr, cs = codes(real, schema), codes(synth, schema)
    one_way = {name: tvd(cr[name][0], cs[name][0], cr[name][1]) for name in cr}
    label = schema.label.name
    pairs, label_pairs = {}, {}
    for a, b in itertools.combinations(cr, 2):
        size = cr[a][1] * cr[b][1]
        d = tvd(cr[a][0] * cr[b][1] + cr[b][0], cs[a][0] * cs[b][1] + cs[b][0], size)
        pairs[f"{a} x {b}"] = d
        if label in (a, b):
            label_pairs[a if b == label else b] = d
    k = schema.num_classes
    real_rate = np.bincount(np.minimum(cr[label][0], k), minlength=k + 2)[:k] / max(real.num_rows, 1)
    synth_rate = np.bincount(np.minimum(cs[label][0], k), minlength=k + 2)[:k] / max(synth.num_rows, 1)
    one_mean = float(np.mean(list(one_way.values())))
    two_mean = float(np.mean(list(pairs.values()))) if pairs else 0.0
    return {
        "one_way_tvd": one_way,
        "one_way_tvd_mean": one_mean,
        "two_way_tvd_mean": two_mean,
        "two_way_tvd_label_mean": float(np.mean(list(label_pairs.values()))) if label_pairs else 0.0,
        "two_way_tvd_label": label_pairs,
        "two_way_tvd_max": max(pairs.values(), default=0.0),
        "base_rate": {
            "classes": [str(c) for c in schema.label.categories],
            "real": real_rate.tolist(),
            "synthetic": synth_rate.tolist(),
            "max_gap": float(np.abs(real_rate - synth_rate).max()),
        },
        "fidelity": 1.0 - (one_mean + two_mean) / 2.0,
    }
