"""NormalizeAndClip: (k, raw features) -> (k, features z-scored with the plan's statistics, L2-clipped to c)."""
from __future__ import annotations

import apache_beam as beam

from transforms.plan import normalize


def _normalize(element, plan):
    k, x = element
    return k, normalize(x, plan.mean, plan.std, plan.clip, plan.bounds)


class NormalizeAndClip(beam.PTransform):
    """(k, float32 (N_k, d)) -> (k, float32 (N_k, d)) with every row of L2 norm <= c."""

    def __init__(self, plan_pcoll):
        super().__init__()
        self.plan = plan_pcoll

    def expand(self, classes):
        return classes | "ZScoreClip" >> beam.Map(_normalize, beam.pvalue.AsSingleton(self.plan))
