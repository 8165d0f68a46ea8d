"""NormalizeAndClip: (k, raw blocks) -> (k, float64 (N_k, d): z-scored with the plan's statistics, L2-clipped to c).

The class is written block by block into ONE preallocated float64 array (its size is the plan's exact N_k): the
memory a class takes on its worker is that array plus an index (``mechanisms.plan.class_bytes``).
"""
from __future__ import annotations

import apache_beam as beam
import numpy as np

from mechanisms.plan import normalize_into


def _normalize(element, plan):
    k, parts = element
    n = int(plan.class_rows[k])
    out = np.empty((n, plan.feature_dim), np.float64)
    filled = 0
    for part in parts:
        m = len(part)
        if filled + m > n:
            raise RuntimeError(f"class {k}: more rows than the first pass counted")  # never expected
        normalize_into(out[filled:filled + m], part, plan.mean, plan.std, plan.clip, plan.bounds)
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
