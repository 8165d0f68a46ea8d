"""GroupByClass: Block -> (k, raw features (N_k, d)) for every class k in range(K), empty classes included.

Grouping raw rows (before the z-score) lets the read stage feed the shuffle directly, so the full input crosses a
stage boundary once; normalisation then runs fused with the mixing. A poisson-mode class with no records still
gets its key (and its T_k rows of noise): the output must not reveal that it is empty.
"""
from __future__ import annotations

import apache_beam as beam
import numpy as np

from transforms.shards import Block


def _split_by_label(block: Block):
    for k in np.unique(block.labels):
        yield int(k), block.features[block.labels == k]


def _concatenate(element, plan):
    k, groups = element
    parts = groups["rows"]
    x = np.concatenate(parts) if parts else np.zeros((0, plan.feature_dim), np.float32)
    return k, x


class GroupByClass(beam.PTransform):
    """Block -> (k, float32 (N_k, d)) for k in range(plan.num_classes)."""

    def __init__(self, plan_pcoll):
        super().__init__()
        self.plan = plan_pcoll

    def expand(self, blocks):
        classes = self.plan | "AllClasses" >> beam.FlatMap(lambda p: [(k, None) for k in range(p.num_classes)])
        return ({"rows": blocks | "SplitByLabel" >> beam.FlatMap(_split_by_label), "class": classes}
                | "CoGroupByClass" >> beam.CoGroupByKey()
                | "Concatenate" >> beam.Map(_concatenate, beam.pvalue.AsSingleton(self.plan)))
