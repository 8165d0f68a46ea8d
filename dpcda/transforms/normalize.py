"""NormalizeAndClip: (k, raw blocks) -> (k, float64 (N_k, d): z-scored with the plan's statistics, L2-clipped to c).

The class is written block by block into ONE preallocated float64 array (its size is the plan's exact N_k): the
memory a class takes on its worker is that array plus an index (``mechanisms.plan.class_bytes``).
"""

from __future__ import annotations

import apache_beam as beam
import numpy as np

from dpcda.mechanisms.plan import normalize_into


def _normalize(element, plan):
    k, parts = element
    n = int(plan.class_rows[k])
    out = np.empty((n, plan.feature_dim), np.float64)
    filled = 0
    for part in parts:
        if part is None:  # the marker that makes every class, also an empty one, arrive here
            continue
        m = len(part)
        if filled + m > n:
            raise RuntimeError(f"class {k}: more rows than the first pass counted")  # never expected
        normalize_into(out[filled : filled + m], part, plan.mean, plan.std, plan.clip, plan.bounds)
        filled += m
    if filled != n:
        raise RuntimeError(f"class {k}: {filled} rows, the first pass counted another number")  # never expected
    return k, out


class NormalizeAndClip(beam.PTransform):
    """(k, iterable of float32 (n, d)) -> (k, float64 (N_k, d)) with every row of L2 norm <= c (1 - CLIP_MARGIN)."""

    def __init__(self, plan_pcoll):
        super().__init__()
        self.plan = plan_pcoll

    def expand(self, classes):
        return classes | "ZScoreClip" >> beam.Map(_normalize, beam.pvalue.AsSingleton(self.plan))


def _normalize_dataset(element, plan):
    _, parts = element
    n = int(sum(plan.class_rows))
    out, labels = np.empty((n, plan.feature_dim), np.float64), np.empty(n, np.int64)
    filled = 0
    for x, y in parts:
        m = len(y)
        if filled + m > n:
            raise RuntimeError("more rows than the first pass counted")  # never expected
        normalize_into(out[filled : filled + m], x, plan.mean, plan.std, plan.clip, plan.bounds)
        labels[filled : filled + m] = y
        filled += m
    if filled != n:
        raise RuntimeError("the dataset has another number of rows than the first pass counted")  # never expected
    return 0, (out, labels)


class NormalizeDataset(beam.PTransform):
    """(0, iterable of (raw rows, labels)) -> (0, (float64 (N, d), int64 (N,))): one preallocated array (DPMix)."""

    def __init__(self, plan_pcoll):
        super().__init__()
        self.plan = plan_pcoll

    def expand(self, dataset):
        return dataset | "ZScoreClipAll" >> beam.Map(_normalize_dataset, beam.pvalue.AsSingleton(self.plan))
