"""ComputeGlobalStats: Block -> FirstPass (class counts and feature moments, exact and private)."""

from __future__ import annotations

import apache_beam as beam

from mechanisms.combiners import FirstPassCombiner


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
