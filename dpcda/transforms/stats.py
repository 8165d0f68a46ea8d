"""ComputeGlobalStats: Block -> FirstPass (class counts and feature moments, exact and private).
ComputeDpBasis: Block -> the DP-PCA basis (d x K float64) of the plan's projection, or None without one."""

from __future__ import annotations

import apache_beam as beam
import numpy as np

from dpcda.mechanisms.combiners import FirstPassCombiner
from dpcda.mechanisms.dppca import CovarianceCombiner, CovarianceSum, dp_basis
from dpcda.mechanisms.plan import normalize_into
from dpcda.storage.build import checked


class FirstPassCombineFn(beam.CombineFn):
    """Thin Beam wrapper: the logic lives in the Beam-free ``FirstPassCombiner``."""

    def __init__(self, bounds):
        self.core = FirstPassCombiner(bounds)

    def create_accumulator(self):
        return self.core.create()

    def add_input(self, acc, block):
        return self.core.add(acc, block.features, block.labels)

    def merge_accumulators(self, accs):
        return self.core.merge(accs)

    def extract_output(self, acc):
        return acc


class ComputeGlobalStats(beam.PTransform):
    """Block -> one FirstPass for the whole input."""

    def __init__(self, bounds):
        super().__init__()
        self.bounds = tuple(bounds)

    def expand(self, blocks):
        return blocks | "FirstPass" >> beam.CombineGlobally(FirstPassCombineFn(self.bounds))


class CovarianceCombineFn(beam.CombineFn):
    """Thin Beam wrapper of ``CovarianceCombiner``; its inputs are (z-scored and clipped rows, the clip)."""

    def create_accumulator(self):
        return CovarianceSum()

    def add_input(self, acc, element):
        rows, clip = element
        return CovarianceCombiner(clip).add(acc, rows)

    def merge_accumulators(self, accs):
        return CovarianceCombiner.merge(accs)

    def extract_output(self, acc):
        return acc


def _normalized_rows(block, plan):
    if plan.pca is None or not len(block):
        return
    out = np.empty(block.features.shape, np.float64)
    normalize_into(out, block.features, plan.mean, plan.std, plan.clip, plan.bounds)
    yield out, plan.clip


def _basis(acc, plan, key):
    if plan.pca is None:
        return None
    return dp_basis(
        acc,
        dim=plan.feature_dim,
        components=plan.pca.components,
        clip=plan.clip,
        noise_std=plan.pca.noise_std,
        key=key,
    )


class ComputeDpBasis(beam.PTransform):
    """Block -> one DP-PCA basis (d x K) from the plan's statistics and noise, or None (no projection)."""

    def __init__(self, plan_pcoll, key_pcoll, *, expected_build=None):
        super().__init__()
        self.plan, self.key, self.expected_build = plan_pcoll, key_pcoll, expected_build

    def expand(self, blocks):
        plan = beam.pvalue.AsSingleton(self.plan)
        return (
            blocks
            | "NormalizeForPca" >> beam.FlatMap(_normalized_rows, plan)
            | "Covariance" >> beam.CombineGlobally(CovarianceCombineFn())
            | "DpBasis" >> beam.Map(checked(_basis, self.expected_build), plan, beam.pvalue.AsSingleton(self.key))
        )
