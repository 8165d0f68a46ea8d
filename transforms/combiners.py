"""Beam-free first-pass combiner: class counts and per-feature moments with Chan's parallel merge.

"Combiners contain logic, accumulators contain data." The moments are of u = (clip(x, lo, hi) - m) / r
in [-1, 1] (see ``privacy.dp_stats``); ``transforms.stats`` wraps this in a ``beam.CombineFn``.
"""
from __future__ import annotations

import dataclasses
from typing import Iterable, Optional

import numpy as np


@dataclasses.dataclass
class Moments:
    """count, mean and M2 (sum of squared deviations) per feature, float64."""

    count: int = 0
    mean: Optional[np.ndarray] = None
    m2: Optional[np.ndarray] = None

    @staticmethod
    def of(u: np.ndarray) -> "Moments":
        u = np.asarray(u, np.float64)
        if len(u) == 0:
            return Moments()
        mean = u.mean(axis=0)
        return Moments(len(u), mean, ((u - mean) ** 2).sum(axis=0))

    def merge(self, other: "Moments") -> "Moments":
        if other.count == 0:
            return self
        if self.count == 0:
            return other
        if self.mean.shape != other.mean.shape:
            raise ValueError(f"feature widths differ: {self.mean.shape[0]} vs {other.mean.shape[0]}")
        n = self.count + other.count
        delta = other.mean - self.mean
        mean = self.mean + delta * (other.count / n)
        m2 = self.m2 + other.m2 + delta ** 2 * (self.count * other.count / n)
        return Moments(n, mean, m2)

    @property
    def sum(self) -> np.ndarray:
        return self.mean * self.count

    @property
    def sum_sq(self) -> np.ndarray:
        return self.m2 + self.count * self.mean ** 2


@dataclasses.dataclass
class FirstPass:
    """Accumulator: exact private first-pass statistics (never released as they are)."""

    moments: Moments = dataclasses.field(default_factory=Moments)
    class_counts: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))

    @property
    def rows(self) -> int:
        return int(self.class_counts.sum())


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
        return self.merge([acc, FirstPass(Moments.of(u), counts)])

    def merge(self, accs: Iterable[FirstPass]) -> FirstPass:
        out = FirstPass()
        for a in accs:
            k = max(len(out.class_counts), len(a.class_counts))
            counts = np.zeros(k, np.int64)
            counts[:len(out.class_counts)] += out.class_counts
            counts[:len(a.class_counts)] += a.class_counts
            out = FirstPass(out.moments.merge(a.moments), counts)
        return out
