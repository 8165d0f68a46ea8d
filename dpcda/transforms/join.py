"""MixByJoin: Block -> pyarrow.Table, the plan-and-join mixing path for the plan's join groups (mechanisms.joinmix).

    blocks --CountPerBlock--> ToList --> record offsets (side input)
    blocks --RecordPieces--> ((g, j), rec) --+
    plan --Chunks--> (g, c) --Requests--> ((g, j), req) --+--> GroupByKey --Partials--> ((g, c), partial) --+
    plan --Chunks--> ((g, c), None) ----------------------------------------------------------------------+
        --> GroupByKey --Finish--> Table

Counters (namespace dpcda): join_record_bytes, join_index_pairs and join_partial_bytes, the shuffle's payload;
distributions join_block_held_bytes and join_chunk_held_bytes, what one worker holds at once in the two joins.
"""

from __future__ import annotations

import apache_beam as beam
from apache_beam.metrics import Metrics

from dpcda.mechanisms.base import Grouping
from dpcda.mechanisms.joinmix import (
    Streams,
    block_counts,
    block_partials,
    chunk_requests,
    finish_chunk,
    record_offsets,
    record_pieces,
)
from dpcda.storage.build import check_build
from dpcda.transforms.mix import finite_table


def _chunks(plan, chunk_rows):
    mix = plan.synthesis
    for g in mix.join_groups:
        n = mix.group_samples(g)
        for c in range(-(-n // chunk_rows)):
            yield g, c


def _counts(block, plan):
    groups = plan.synthesis.grouping.count(plan.num_classes)
    return (block.source, block.first_row), block_counts(plan.mechanism, block.labels, groups)


def _offsets(counts, plan):
    return record_offsets(counts, plan.synthesis.grouping.count(plan.num_classes))


class _PiecesFn(beam.DoFn):
    def __init__(self):
        self.bytes = Metrics.counter("dpcda", "join_record_bytes")

    def process(self, block, plan, offsets):
        for k, piece in record_pieces(
            block.features,
            block.labels,
            offsets[(block.source, block.first_row)],
            mechanism=plan.mechanism,
            groups=plan.synthesis.join_groups,
            block_rows=plan.synthesis.join_block_rows,
            mean=plan.mean,
            std=plan.std,
            clip=plan.clip,
            bounds=plan.bounds,
        ):
            self.bytes.inc(piece[1].nbytes + piece[2].nbytes)
            yield k, ("rec", piece)


class _RequestsFn(beam.DoFn):
    def __init__(self, chunk_rows, expected_build=None):
        self.chunk_rows, self.expected_build = chunk_rows, expected_build
        self.pairs = Metrics.counter("dpcda", "join_index_pairs")

    def setup(self):
        check_build(self.expected_build)  # its index draws on the release's noise threads

    def process(self, gc, plan, key):
        g, c = gc
        mix = plan.synthesis
        rows = min(self.chunk_rows, mix.group_samples(g) - c * self.chunk_rows)
        for k, req in chunk_requests(
            streams=Streams(plan.mechanism),
            key=key,
            group=g,
            chunk=c,
            records=mix.group_records(plan.class_rows, g),
            mode=plan.mode,
            mixing_order=mix.mixing_order,
            rows=rows,
            sampling_rate=mix.sampling_rates[g],
            block_rows=mix.join_block_rows,
        ):
            self.pairs.inc(len(req[1]))
            yield k, ("req", req)


class _PartialsFn(beam.DoFn):
    def __init__(self):
        self.bytes = Metrics.counter("dpcda", "join_partial_bytes")
        self.held = Metrics.distribution("dpcda", "join_block_held_bytes")

    def process(self, element, plan):
        (g, j), values = element
        values = list(values)  # a join block's records and requests: what this worker holds at once
        self.held.update(sum(v[1].nbytes + v[2].nbytes for _, v in values))  # rows and labels, or positions and ids
        for k, part in block_partials(
            g,
            j,
            values,
            dim=plan.feature_dim,
            num_classes=plan.num_classes,
            with_labels=plan.synthesis.grouping is not Grouping.CLASS,
        ):
            self.bytes.inc(part[2].nbytes + (part[3].nbytes if part[3] is not None else 0))
            yield k, part


class _FinishFn(beam.DoFn):
    def __init__(self, chunk_rows, soft_labels, features_column, label_column, expected_build=None):
        self.chunk_rows, self.soft_labels = chunk_rows, soft_labels
        self.fc, self.lc, self.expected_build = features_column, label_column, expected_build
        self.rows_written = Metrics.counter("dpcda", "rows_synthesized")
        self.held = Metrics.distribution("dpcda", "join_chunk_held_bytes")

    def setup(self):
        check_build(self.expected_build)

    def process(self, element, plan, key):
        (g, c), partials = element
        partials = [p for p in partials if p is not None]  # one chunk's partial sums: held at once (sorted by block)
        self.held.update(sum(p[2].nbytes + (p[3].nbytes if p[3] is not None else 0) for p in partials))
        mix = plan.synthesis
        rows = min(self.chunk_rows, mix.group_samples(g) - c * self.chunk_rows)
        dpmix = mix.grouping is not Grouping.CLASS  # one group, the dataset: label scores released
        feats, labels = finish_chunk(
            partials,
            streams=Streams(plan.mechanism),
            key=key,
            group=g,
            chunk=c,
            rows=rows,
            dim=plan.feature_dim,
            num_classes=plan.num_classes,
            mixing_order=mix.mixing_order,
            sigma_x=mix.sigma_x,
            sigma_y=mix.sigma_y,
            soft_labels=self.soft_labels,
            lowpass=mix.lowpass,
            denoise=mix.denoise_spec,
        )
        self.rows_written.inc(rows)
        where = "dataset" if dpmix else f"class {g}"
        yield finite_table(feats, labels, self.fc, self.lc, soft=dpmix or self.soft_labels, where=where)


class MixByJoin(beam.PTransform):
    """Block -> pyarrow.Table: the rows of the plan's join groups, no group held on one worker."""

    def __init__(
        self,
        plan_pcoll,
        key_pcoll,
        *,
        chunk_rows=4096,
        soft_labels=False,
        features_column="features",
        label_column="label",
        expected_build=None,
    ):
        super().__init__()
        self.plan, self.key, self.chunk_rows, self.expected_build = plan_pcoll, key_pcoll, chunk_rows, expected_build
        self.finish = _FinishFn(chunk_rows, soft_labels, features_column, label_column, expected_build)

    def expand(self, blocks):
        plan = beam.pvalue.AsSingleton(self.plan)
        key = beam.pvalue.AsSingleton(self.key)
        offsets = (
            blocks
            | "CountPerBlock" >> beam.Map(_counts, plan)
            | "AllBlockCounts" >> beam.combiners.ToList()
            | "RecordOffsets" >> beam.Map(_offsets, plan)
        )
        records = blocks | "RecordPieces" >> beam.ParDo(_PiecesFn(), plan, beam.pvalue.AsSingleton(offsets))
        chunks = self.plan | "Chunks" >> beam.FlatMap(_chunks, self.chunk_rows) | "SpreadChunks" >> beam.Reshuffle()
        requests = chunks | "Requests" >> beam.ParDo(_RequestsFn(self.chunk_rows, self.expected_build), plan, key)
        partials = (
            (records, requests)
            | "RecordsAndRequests" >> beam.Flatten()
            | "JoinByBlock" >> beam.GroupByKey()
            | "PartialSums" >> beam.ParDo(_PartialsFn(), plan)
        )
        markers = chunks | "ChunkMarkers" >> beam.Map(lambda gc: (gc, None))
        return (
            (partials, markers)
            | "WithEveryChunk" >> beam.Flatten()
            | "GroupByChunk" >> beam.GroupByKey()
            | "Finish" >> beam.ParDo(self.finish, plan, key)
        )
