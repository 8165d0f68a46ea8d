"""NormalizeAndClip: Block -> (class, normalised Block), z-scored with the plan's statistics, L2-clipped."""
from __future__ import annotations

import apache_beam as beam
import numpy as np

from transforms.plan import normalize
from transforms.shards import Block


def _split(block: Block, plan):
    z = normalize(block.features, plan.mean, plan.std, plan.clip, plan.bounds)
    for k in np.unique(block.labels):
        sel = block.labels == k
        yield int(k), Block(z[sel], block.labels[sel])


class NormalizeAndClip(beam.PTransform):
    """Block -> (k, Block) per class present in the block."""

    def __init__(self, plan_pcoll):
        super().__init__()
        self.plan = plan_pcoll

    def expand(self, blocks):
        return blocks | "ZScoreClipSplit" >> beam.FlatMap(_split, beam.pvalue.AsSingleton(self.plan))
