"""The p3gm stages (mechanisms.p3gm holds the logic).

FitP3gm: (0, (z-scored clipped rows, labels)) + the DP-PCA basis -> the fitted model (DP-EM prior and the VAE trained
with DP-SGD), on one worker (GPU when present). Everything it outputs is DP; from here on it is public. The rows are
put in a canonical order first, so a retried fit redraws the same model whatever order the shuffle delivered.
SampleP3gm: the model -> pyarrow.Tables of T rows, chunk by chunk on any worker: sampling is post-processing, each
chunk deterministic in (key, chunk) so a retried bundle redraws the same rows.
"""

from __future__ import annotations

import logging
import time

import apache_beam as beam
from apache_beam.metrics import Metrics

from dpcda.mechanisms.device import pick_device
from dpcda.mechanisms.p3gm import sample_chunks, spec_from_plan
from dpcda.progress import step_callback
from dpcda.storage.build import check_build
from dpcda.transforms.mix import finite_table

log = logging.getLogger(__name__)


class _FitFn(beam.DoFn):
    def __init__(self, device: str, expected_build: tuple | None = None):
        self.device_pref, self.expected_build = device, expected_build

    def setup(self):
        check_build(self.expected_build)
        self.device = pick_device(self.device_pref)

    def process(self, element, plan, key, basis):
        from dpcda.mechanisms.p3gm import fit

        _, (x, y) = element
        start = time.time()
        spec = spec_from_plan(plan)

        progress = step_callback("p3gm training")  # the loss is a statistic of private rows (not DP): never shown
        model = fit(x, y, basis, plan.clip, spec, key, self.device, progress=progress)
        log.info("stage=p3gm fitted steps=%d device=%s seconds=%.1f", spec.steps, self.device, time.time() - start)
        yield model


class _SampleFn(beam.DoFn):
    def __init__(self, device: str, features_column: str, label_column: str, expected_build: tuple | None = None):
        self.device_pref, self.expected_build = device, expected_build
        self.fc, self.lc = features_column, label_column
        self.rows_written = Metrics.counter("dpcda", "rows_synthesized")

    def setup(self):
        check_build(self.expected_build)
        self.device = pick_device(self.device_pref)

    def process(self, element, plan, key, model):
        from dpcda.mechanisms.p3gm import sample_rows

        chunk, rows = element
        feats, labels = sample_rows(
            model, spec_from_plan(plan), rows=rows, chunk=chunk, key=key, clip=plan.clip, device=self.device
        )
        self.rows_written.inc(len(labels))
        yield finite_table(feats, labels, self.fc, self.lc, soft=False, where=f"p3gm chunk {chunk}")


class FitP3gm(beam.PTransform):
    """(0, (float64 (N, d), int64 (N,))) -> one fitted model (``mechanisms.p3gm``)."""

    def __init__(self, plan_pcoll, key_pcoll, basis_pcoll, *, device="auto", expected_build=None):
        super().__init__()
        self.plan, self.key, self.basis = plan_pcoll, key_pcoll, basis_pcoll
        self.fn = _FitFn(device, expected_build)

    def expand(self, dataset):
        return dataset | "Fit" >> beam.ParDo(
            self.fn,
            beam.pvalue.AsSingleton(self.plan),
            beam.pvalue.AsSingleton(self.key),
            beam.pvalue.AsSingleton(self.basis),
        )


class SampleP3gm(beam.PTransform):
    """The fitted model -> pyarrow.Table chunks of the plan's T rows (spread over workers by a reshuffle)."""

    def __init__(
        self,
        plan_pcoll,
        key_pcoll,
        *,
        chunk_rows=4096,
        device="auto",
        features_column="features",
        label_column="label",
        expected_build=None,
    ):
        super().__init__()
        self.plan, self.key, self.chunk_rows = plan_pcoll, key_pcoll, chunk_rows
        self.fn = _SampleFn(device, features_column, label_column, expected_build)

    def expand(self, model):
        return (
            self.plan
            | "Chunks" >> beam.FlatMap(sample_chunks, self.chunk_rows)
            | "Spread" >> beam.Reshuffle()
            | "Sample"
            >> beam.ParDo(
                self.fn,
                beam.pvalue.AsSingleton(self.plan),
                beam.pvalue.AsSingleton(self.key),
                beam.pvalue.AsSingleton(model),
            )
        )
