"""The synthesis stages, one per way a mechanism groups its records; each yields pyarrow.Tables of released rows.

MixWithinClass (dpcda): (k, class matrix) -> T_k rows per class; every class in range(K) arrives (``GroupByClass``),
also one with no records. MixDataset (dpmix): (0, (dataset matrix, labels)) -> T rows. PerturbRecords (local,
randproj): raw Block -> one row per record. The device is picked once per worker; a worker whose code differs from
the launcher's refuses to run; rows that are not finite are never written.
"""

from __future__ import annotations

import logging
import time

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics

from dpcda.mechanisms.device import pick_device
from dpcda.mechanisms.dpcda import mix_class
from dpcda.mechanisms.dpmix import mix_dataset
from dpcda.mechanisms.local import perturb_block
from dpcda.mechanisms.plan import PlanError, normalize_into
from dpcda.mechanisms.postprocess import make_postprocess
from dpcda.progress import track
from dpcda.storage.build import check_build
from dpcda.storage.shards import block_table

log = logging.getLogger(__name__)


class _MixFn(beam.DoFn):
    def __init__(
        self,
        device: str,
        chunk_rows: int,
        features_column: str,
        label_column: str,
        soft_labels: bool = False,
        expected_build: tuple | None = None,
    ):
        self.device_pref, self.chunk_rows, self.soft_labels = device, chunk_rows, soft_labels
        self.fc, self.lc = features_column, label_column
        self.expected_build = expected_build
        self.rows_written = Metrics.counter("dpcda", "rows_synthesized")

    def setup(self):
        check_build(self.expected_build)
        self.device = pick_device(self.device_pref)
        self.bar = None

    def process(self, element, plan, key, basis=None):
        k, x = element
        start = time.time()
        mix = plan.synthesis
        if self.bar is None:  # one per worker: the rows it mixes, of every class's, against the release's total
            self.bar = track("mix rows", sum(mix.samples_per_class), unit="rows")
        for chunk, feats, labels in mix_class(
            x,
            key=key,
            class_index=k,
            num_classes=plan.num_classes,
            mode=plan.mode,
            mixing_order=mix.mixing_order,
            sigma_x=mix.sigma_x,
            samples=mix.samples_per_class[k],
            chunk_rows=self.chunk_rows,
            sampling_rate=mix.sampling_rates[k],
            sigma_y=mix.sigma_y,
            device=self.device,
            lowpass=mix.lowpass,
            denoise=mix.denoise_spec,
            soft_labels=self.soft_labels,
            **_projection(plan, basis),
        ):
            self.rows_written.inc(len(labels))
            table = finite_table(feats, labels, self.fc, self.lc, soft=self.soft_labels, where=f"class {k}")
            self.bar.update(len(labels))
            yield table
        log.info(
            "stage=mix class=%d rows=%d device=%s seconds=%.2f",
            k,
            mix.samples_per_class[k],
            self.device,
            time.time() - start,
        )

    def teardown(self):
        if getattr(self, "bar", None) is not None:
            self.bar.close()


def _projection(plan, basis) -> dict:
    """The DP-PCA basis and the clip it keeps projected rows inside, for the mixers (nothing without a basis)."""
    return {} if basis is None else {"basis": basis, "clip": plan.clip}


def finite_table(feats, labels, fc, lc, *, soft, where):
    """The Arrow table of released rows, after checking that every value is finite (else nothing is published)."""
    if not (np.isfinite(feats).all() and np.isfinite(labels).all()):
        raise PlanError(
            f"{where}: synthetic values are not finite (the statistics or bounds overflow the z-score); "
            f"nothing was published"
        )
    return block_table(feats, labels, fc, lc, soft=soft)


class _MixDatasetFn(beam.DoFn):
    def __init__(
        self, device: str, chunk_rows: int, features_column: str, label_column: str, expected_build: tuple | None = None
    ):
        self.device_pref, self.chunk_rows, self.expected_build = device, chunk_rows, expected_build
        self.fc, self.lc = features_column, label_column
        self.rows_written = Metrics.counter("dpcda", "rows_synthesized")

    def setup(self):
        check_build(self.expected_build)
        self.device = pick_device(self.device_pref)

    def process(self, element, plan, key, basis=None):
        _, (x, y) = element
        mix = plan.synthesis
        bar = track("mix rows", mix.samples_total, unit="rows")
        for _, feats, scores in mix_dataset(
            x,
            y,
            key=key,
            num_classes=plan.num_classes,
            mode=plan.mode,
            mixing_order=mix.mixing_order,
            sigma_x=mix.sigma_x,
            sigma_y=mix.sigma_y,
            samples=mix.samples_total,
            chunk_rows=self.chunk_rows,
            sampling_rate=mix.sampling_rates[0],
            device=self.device,
            lowpass=mix.lowpass,
            denoise=mix.denoise_spec,
            **_projection(plan, basis),
        ):
            self.rows_written.inc(len(scores))
            table = finite_table(feats, scores, self.fc, self.lc, soft=True, where="dataset")
            bar.update(len(scores))
            yield table
        bar.close()


class _PerturbFn(beam.DoFn):
    def __init__(self, features_column: str, label_column: str, expected_build: tuple | None = None):
        self.fc, self.lc, self.expected_build = features_column, label_column, expected_build
        self.rows_written = Metrics.counter("dpcda", "rows_synthesized")

    def setup(self):
        check_build(self.expected_build)
        self._projection = None

    def process(self, block, plan, key):
        rows = plan.synthesis  # mechanisms.local.PerturbPlan: its public map (randproj's R) and noise
        if self._projection is None:
            self._projection = (rows.projection_matrix(plan.feature_dim),)
        x = np.empty(block.features.shape, np.float64)
        normalize_into(x, block.features, plan.mean, plan.std, plan.clip, plan.bounds)
        post = make_postprocess(lowpass=rows.lowpass, denoise=rows.denoise_spec)
        feats = perturb_block(
            x,
            key=key,
            block=(block.source, block.first_row),
            sigma_x=rows.sigma_x,
            projection=self._projection[0],
            post=post,
        )
        self.rows_written.inc(len(feats))
        yield finite_table(feats, block.labels, self.fc, self.lc, soft=False, where=f"{block.source}")


class MixDataset(beam.PTransform):
    """(0, (float64 (N, d), int64 (N,))) -> pyarrow.Table: T DPMix rows with label scores and their argmax."""

    def __init__(
        self,
        plan_pcoll,
        key_pcoll,
        *,
        device="auto",
        chunk_rows=4096,
        features_column="features",
        label_column="label",
        expected_build=None,
        basis_pcoll=None,
    ):
        super().__init__()
        self.plan, self.key, self.basis = plan_pcoll, key_pcoll, basis_pcoll
        self.fn = _MixDatasetFn(device, chunk_rows, features_column, label_column, expected_build)

    def expand(self, dataset):
        return dataset | "MixDataset" >> beam.ParDo(
            self.fn, beam.pvalue.AsSingleton(self.plan), beam.pvalue.AsSingleton(self.key), *_basis_side(self.basis)
        )


class PerturbRecords(beam.PTransform):
    """Block -> pyarrow.Table: each record normalised, (projected,) plus noise, with its label (local, randproj)."""

    def __init__(self, plan_pcoll, key_pcoll, *, features_column="features", label_column="label", expected_build=None):
        super().__init__()
        self.plan, self.key = plan_pcoll, key_pcoll
        self.fn = _PerturbFn(features_column, label_column, expected_build)

    def expand(self, blocks):
        return blocks | "Perturb" >> beam.ParDo(
            self.fn, beam.pvalue.AsSingleton(self.plan), beam.pvalue.AsSingleton(self.key)
        )


class MixWithinClass(beam.PTransform):
    """(k, float32 (N_k, d)) -> pyarrow.Table: T_k synthetic rows of class k."""

    def __init__(
        self,
        plan_pcoll,
        key_pcoll,
        *,
        device="auto",
        chunk_rows=4096,
        features_column="features",
        label_column="label",
        soft_labels=False,
        expected_build=None,
        basis_pcoll=None,
    ):
        super().__init__()
        self.plan, self.key, self.basis = plan_pcoll, key_pcoll, basis_pcoll
        self.fn = _MixFn(device, chunk_rows, features_column, label_column, soft_labels, expected_build)

    def expand(self, classes):
        return classes | "Mix" >> beam.ParDo(
            self.fn, beam.pvalue.AsSingleton(self.plan), beam.pvalue.AsSingleton(self.key), *_basis_side(self.basis)
        )


def _basis_side(basis_pcoll) -> tuple:
    """The DP-PCA basis as a side input (transforms.stats.ComputeDpBasis), or nothing without a projection."""
    return () if basis_pcoll is None else (beam.pvalue.AsSingleton(basis_pcoll),)
