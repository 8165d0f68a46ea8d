"""The DP domain step's stages (``mechanisms.domain`` holds the logic; ``privacy.domain`` the accounting).

ReadColumns: file paths -> pyarrow.RecordBatch of some columns. DeriveDomain: PBegin -> the complete ``TableSchema``
(one element), in two passes over the input files, each reading them again (so no runner holds the rows between the
passes): pass 1 counts each numeric column's coarse cells by a combiner and each (column, value) summed per (column,
kind, shard of the value), thresholded there with each value's own noise (so no worker holds every value); the
first pass's DP outputs on one worker; pass 2 reads the numeric columns again and counts their fine cells inside the
DP ranges by a combiner; then the schema.
"""

from __future__ import annotations

import apache_beam as beam
import numpy as np

from dpcda.mechanisms.domain.derive import complete, first_pass, noisy_values
from dpcda.mechanisms.domain.summaries import (
    CoarseCounter,
    FineCounter,
    fine_grids,
    merge_value_counts,
    value_count_shards,
)
from dpcda.storage.build import check_build, checked
from dpcda.storage.tables import read_columns


class _ReadColumnsFn(beam.DoFn):
    def __init__(self, names, batch_rows):
        self.names, self.batch_rows = list(names), batch_rows

    def process(self, path):
        yield from read_columns(path, self.names, self.batch_rows)


class ReadColumns(beam.PTransform):
    """PBegin -> pyarrow.RecordBatch: the columns ``names`` of every Parquet shard in ``files``."""

    def __init__(self, files, names, batch_rows: int = 65536):
        super().__init__()
        self.files, self.fn = list(files), _ReadColumnsFn(names, batch_rows)

    def expand(self, pbegin):
        return pbegin | "ListShards" >> beam.Create(self.files) | "Spread" >> beam.Reshuffle() | beam.ParDo(self.fn)


class _SumFn(beam.CombineFn):
    """numpy count arrays (or ints) -> their sum."""

    def create_accumulator(self):
        return None

    def add_input(self, acc, counts):
        return counts if acc is None else acc + counts

    def merge_accumulators(self, accs):
        out = None
        for a in accs:
            if a is not None:
                out = a if out is None else out + a
        return out

    def extract_output(self, acc):
        return acc


class _MergeCountsFn(beam.CombineFn):
    """Tables of (value, count) -> one, each value's counts summed (``summaries.merge_value_counts``); an
    accumulator holds at most ``_PENDING`` tables before they are merged."""

    _PENDING = 32

    def create_accumulator(self):
        return []

    def add_input(self, acc, table):
        acc.append(table)
        return [merge_value_counts(acc)] if len(acc) >= self._PENDING else acc

    def merge_accumulators(self, accs):
        tables = [t for a in accs for t in a]
        return [merge_value_counts(tables)] if len(tables) > 1 else tables

    def extract_output(self, acc):
        return merge_value_counts(acc) if acc else None


class _ThresholdFn(beam.DoFn):
    """((column, kind, shard), table of value and count) -> (column, value, noisy count) where the noisy count
    reaches the threshold (``derive.noisy_values``)."""

    def __init__(self, event, expected_build):
        self.event, self.expected_build = event, expected_build

    def setup(self):
        check_build(self.expected_build)

    def process(self, item, key):
        (column, *_), counts = item
        if counts is not None:
            yield from noisy_values(key, column, counts, self.event)


def _coarse(batch, request):
    counter = CoarseCounter(request)
    return counter.add(counter.create(), batch)


def _fine(batch, request, first):
    counter = FineCounter(request, fine_grids(request, first.ranges, first.spikes))
    return counter.add(counter.create(), batch)


class DeriveDomain(beam.PTransform):
    """PBegin -> TableSchema (one): the DP domain step for ``request`` on the Parquet ``files``, with ``event``'s
    noise."""

    def __init__(self, files, request, event, key, share: float, *, expected_build=None):
        super().__init__()
        self.files, self.request, self.event, self.key, self.share = list(files), request, event, key, share
        self.build = expected_build

    def expand(self, pbegin):
        req, ev, build = self.request, self.event, self.build
        key = beam.pvalue.AsSingleton(self.key)
        empty = np.zeros(CoarseCounter(req).offsets[-1], np.int64)
        batches = pbegin | "ReadColumns" >> ReadColumns(self.files, [d.name for d in req.derive])
        coarse = (
            batches
            | "CoarseCounts" >> beam.Map(_coarse, req)
            | "SumCoarse" >> beam.CombineGlobally(_SumFn())
            | "OrEmpty" >> beam.Map(lambda acc: empty if acc is None else acc)
        )
        kept = (
            batches
            | "ValueCounts" >> beam.FlatMap(value_count_shards, req)
            | "SumPerShard" >> beam.CombinePerKey(_MergeCountsFn())
            | "Threshold" >> beam.ParDo(_ThresholdFn(ev, build), key)
            | "Released" >> beam.combiners.ToList()
        )
        first = coarse | "FirstPass" >> beam.Map(checked(_first, build), req, beam.pvalue.AsSingleton(kept), ev, key)
        if req.numeric:  # pass 2 reads the files again: the rows of pass 1 are not kept for it
            fine = (
                pbegin
                | "ReadNumeric" >> ReadColumns(self.files, [d.name for d in req.numeric])
                | "FineCounts" >> beam.Map(_fine, req, beam.pvalue.AsSingleton(first))
                | "SumFine" >> beam.CombineGlobally(_SumFn())
            )
        else:
            fine = first | "NoFine" >> beam.Map(lambda _: None)
        return first | "Complete" >> beam.Map(
            checked(_complete, build), beam.pvalue.AsSingleton(fine), req, ev, key, self.share
        )


def _first(coarse, request, kept, event, key):
    return first_pass(request, coarse, kept, event, key)


def _complete(first, acc, request, event, key, share):
    fines = fine_grids(request, first.ranges, first.spikes)
    acc = FineCounter(request, fines).create() if acc is None else acc
    return complete(request, first, acc, fines, event, key, share)
