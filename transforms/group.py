"""GroupByClass: Block -> (k, iterable of raw float32 row blocks) for every class k in range(K), empty classes included.

Grouping raw rows (before the z-score) lets the read stage feed the shuffle directly, so the full input crosses a
stage boundary once; normalisation then runs fused with the mixing, writing each block straight into the class's one
preallocated array (``NormalizeAndClip``). A poisson-mode class with no records still gets its key (and its T_k rows
of noise): the output must not reveal that it is empty.
"""
from __future__ import annotations

import apache_beam as beam
import numpy as np

from storage.shards import Block


def _split_by_label(block: Block):
    for k in np.unique(block.labels):
        yield int(k), block.features[block.labels == k]


def _blocks(element):
    k, groups = element
    return k, groups["rows"]


class GroupByClass(beam.PTransform):
    """Block -> (k, iterable of float32 (n, d) blocks) for k in range(plan.num_classes)."""

    def __init__(self, plan_pcoll):
        super().__init__()
        self.plan = plan_pcoll

    def expand(self, blocks):
        classes = self.plan | "AllClasses" >> beam.FlatMap(lambda p: [(k, None) for k in range(p.num_classes)])
        return ({"rows": blocks | "SplitByLabel" >> beam.FlatMap(_split_by_label), "class": classes}
                | "CoGroupByClass" >> beam.CoGroupByKey()
                | "Blocks" >> beam.Map(_blocks))
