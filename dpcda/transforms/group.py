"""GroupByClass: Block -> (k, iterable of raw float32 row blocks) for every class k in range(K) that the plan mixes in
memory (``plan.synthesis.mixing_paths``; the join path's classes go to ``transforms.join``), empty classes included.
GroupDataset: Block -> (0, iterable of (rows, labels)): the whole dataset, for DPMix.

Grouping raw rows (before the z-score) lets the read stage feed the shuffle directly, so the full input crosses a
stage boundary once; normalisation then runs fused with the mixing, writing each block straight into the class's one
preallocated array (``NormalizeAndClip``). A poisson-mode class with no records still gets its key (and its T_k rows
of noise): the output must not reveal that it is empty.
"""

from __future__ import annotations

import apache_beam as beam
import numpy as np

from dpcda.storage.shards import Block


def _in_memory(plan, k: int) -> bool:
    paths = plan.synthesis.mixing_paths
    return not paths or paths[k] == "memory"  # join classes never meet on one worker


def _split_by_label(block: Block, plan):
    for k in np.unique(block.labels):
        if _in_memory(plan, int(k)):
            yield int(k), block.features[block.labels == k]


def _memory_classes(plan):
    return [(k, None) for k in range(plan.num_classes) if _in_memory(plan, k)]


def _with_labels(block: Block):
    return 0, (block.features, block.labels)


class GroupByClass(beam.PTransform):
    """Block -> (k, iterable of float32 (n, d) blocks, with one None) for k in range(plan.num_classes).

    A plain GroupByKey (not CoGroupByKey, which copies every group into a list): on Dataflow a large group is then
    read lazily, page by page, while NormalizeAndClip fills the class's array.
    """

    def __init__(self, plan_pcoll):
        super().__init__()
        self.plan = plan_pcoll

    def expand(self, blocks):
        rows = blocks | "SplitByLabel" >> beam.FlatMap(_split_by_label, beam.pvalue.AsSingleton(self.plan))
        classes = self.plan | "AllClasses" >> beam.FlatMap(_memory_classes)
        return (rows, classes) | "WithEmptyClasses" >> beam.Flatten() | "GroupByClass" >> beam.GroupByKey()


class GroupDataset(beam.PTransform):
    """Block -> (0, iterable of (float32 (n, d), int64 (n,))): the whole dataset on one worker (DPMix)."""

    def expand(self, blocks):
        return blocks | "KeyAll" >> beam.Map(_with_labels) | "GroupAll" >> beam.GroupByKey()
