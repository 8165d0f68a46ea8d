"""The marginals stages (mechanisms.marginals holds the logic).

CountMarginals: Block -> one flat int64 array of every one-way and two-way count (a combiner: its accumulator is the
count arrays, whatever the number of rows). FitMarginalsFn: the counts + plan + key -> the noisy measurements, the
picked pairs, the fitted model and its sampled rows as pyarrow.Tables, on one worker; its second output is the plan
completed with the picks (DP), which the manifest states. The fitted model is written into the run directory as
``model/`` (``mechanisms.marginals.model``) before the first row is yielded, so the manifest draft lists it.
"""

from __future__ import annotations

import dataclasses

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from dpcda.mechanisms.marginals import MarginalCounter, codes_of, domain_of, fit_and_sample, integer_columns, model
from dpcda.progress import track
from dpcda.storage.build import check_build
from dpcda.transforms.mix import finite_table
from dpcda.transforms.synthesize import _Synthesis


class _CountFn(beam.CombineFn):
    """Block -> the counts of ``MarginalCounter`` (its accumulator: the count arrays, merged by addition)."""

    def __init__(self, schema, bins: int):
        self.schema, self.bins = schema, bins
        self.counter = MarginalCounter(domain_of(schema, bins))

    def create_accumulator(self):
        return self.counter.create()

    def add_input(self, acc, block):
        return self.counter.add(acc, codes_of(block.features, block.labels, self.schema, self.bins))

    def merge_accumulators(self, accs):
        return self.counter.merge(accs)

    def extract_output(self, acc):
        return acc


class _FitFn(beam.DoFn):
    STATED = "stated"

    def __init__(
        self,
        schema,
        integers,
        chunk_rows: int,
        features_column: str,
        label_column: str,
        expected_build=None,
        directory: str = "",
        arrow_schema=None,
    ):
        self.schema, self.integers, self.chunk_rows, self.expected_build = schema, integers, chunk_rows, expected_build
        self.directory, self.arrow_schema = directory, arrow_schema
        self.fc, self.lc = features_column, label_column
        self.rows_written = Metrics.counter("dpcda", "rows_synthesized")

    def setup(self):
        check_build(self.expected_build)

    def process(self, counts, plan, key):
        stated, chunks = fit_and_sample(
            counts, plan, self.schema, key, self.chunk_rows, self.integers, on_fit=self._keep_model(plan)
        )
        yield beam.pvalue.TaggedOutput(self.STATED, dataclasses.replace(plan, synthesis=stated))
        with track("marginals rows sampled", stated.samples_total, unit="rows") as bar:  # the model's total (DP)
            for i, (x, y) in enumerate(chunks):
                self.rows_written.inc(len(y))
                table = finite_table(x, y, self.fc, self.lc, soft=False, where=f"marginals chunk {i}")
                bar.update(len(y))
                yield table

    def _keep_model(self, plan):
        """The callback that writes the fitted model into ``DIR/model/`` (no directory: nothing kept). A retried bundle
        writes the same files again (the fit is a function of the key and the counts)."""
        if not self.directory:
            return None

        def keep(measured, fitted):
            fm = model.from_fit(measured, fitted, plan.synthesis.domain, self.schema, self.arrow_schema, self.integers)
            for name, data in model.model_files(fm).items():
                with FileSystems.create(FileSystems.join(self.directory, model.MODEL_DIR, name)) as fh:
                    fh.write(data)

        return keep


class FitAndSampleMarginals(_Synthesis):
    """Block -> pyarrow.Table (encoded features, label): counts by a combiner, then measured, fitted and sampled on one
    worker (``mechanisms.marginals``); sets ``stated_plan`` (the plan with the measured pairs)."""

    def expand(self, blocks):
        cfg, common = self.cfg, self.common
        counts = blocks | "CountMarginals" >> beam.CombineGlobally(_CountFn(cfg.table, cfg.mechanism.bins))
        out = counts | "FitMarginals" >> beam.ParDo(
            _FitFn(
                cfg.table,
                integer_columns(cfg.input, cfg.table),  # the input's footer, read here in the launcher
                cfg.chunk_rows,
                common["features_column"],
                common["label_column"],
                common["expected_build"],
                self.directory,
                _arrow_schema(cfg.input),  # the input's footer, read here in the launcher
            ),
            beam.pvalue.AsSingleton(self.plan),
            beam.pvalue.AsSingleton(self.key),
        ).with_outputs(_FitFn.STATED, main="tables")
        self.stated_plan = out[_FitFn.STATED]
        return out.tables


def _arrow_schema(source: str):
    """The Arrow schema of the input's first file (its footer; metadata dropped), or None where nothing matches."""
    from dpcda.storage.paths import expand_glob
    from dpcda.storage.tables import arrow_schema_of

    files = expand_glob(source)
    return arrow_schema_of(files[0]) if files else None
