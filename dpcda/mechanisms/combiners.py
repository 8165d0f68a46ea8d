"""Beam-free first-pass combiner: class counts and exact integer sums of the quantized moments.

"Combiners contain logic, accumulators contain data." Each record contributes (u, 2u^2 - 1) per feature, with
u = (clip(x, lo, hi) - m) / r in [-1, 1], rounded to multiples of 2^-16 (``privacy.dp_stats``). The sums are int64,
so merging is exact and associative: any split of the input into bundles gives bit-identical sums, and the
sensitivity the DP statistics assume holds for the computed sums, not only for exact arithmetic.
``transforms.stats`` wraps this in a ``beam.CombineFn``.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Optional

import numpy as np

from dpcda.privacy.dp_stats import quantized_contributions


@dataclasses.dataclass
class FirstPass:
    """Accumulator: exact private first-pass statistics (never released as they are).

    ``sum_qu`` and ``sum_qv`` are the int64 sums of the quantized u and 2u^2 - 1 (units of 2^-16), per feature.
    """

    count: int = 0
    sum_qu: Optional[np.ndarray] = None
    sum_qv: Optional[np.ndarray] = None
    class_counts: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))

    @property
    def rows(self) -> int:
        return int(self.class_counts.sum())

    @property
    def dim(self) -> Optional[int]:
        return None if self.sum_qu is None else int(self.sum_qu.shape[0])


class FirstPassCombiner:
    def __init__(self, bounds: tuple[float, float]):
        lo, hi = bounds
        self.mid, self.half = (lo + hi) / 2.0, (hi - lo) / 2.0
        self.bounds = (lo, hi)

    def create(self) -> FirstPass:
        return FirstPass()

    def add(self, acc: FirstPass, features: np.ndarray, labels: np.ndarray) -> FirstPass:
        u = (np.clip(features, *self.bounds).astype(np.float64) - self.mid) / self.half
        counts = np.bincount(labels, minlength=len(acc.class_counts))
        part = FirstPass(len(u), None, None, counts)
        if len(u):
            qu, qv = quantized_contributions(u)
            part.sum_qu, part.sum_qv = qu.sum(axis=0), qv.sum(axis=0)
        return self.merge([acc, part])

    def merge(self, accs: Iterable[FirstPass]) -> FirstPass:
        out = FirstPass()
        for a in accs:
            k = max(len(out.class_counts), len(a.class_counts))
            counts = np.zeros(k, np.int64)
            counts[: len(out.class_counts)] += out.class_counts
            counts[: len(a.class_counts)] += a.class_counts
            if a.sum_qu is None:
                qu, qv = out.sum_qu, out.sum_qv
            elif out.sum_qu is None:
                qu, qv = a.sum_qu, a.sum_qv
            else:
                if out.sum_qu.shape != a.sum_qu.shape:
                    raise ValueError(f"feature widths differ: {out.sum_qu.shape[0]} vs {a.sum_qu.shape[0]}")
                qu, qv = out.sum_qu + a.sum_qu, out.sum_qv + a.sum_qv
            out = FirstPass(out.count + a.count, qu, qv, counts)
        return out
