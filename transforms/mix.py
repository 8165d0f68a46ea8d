"""MixWithinClass: (k, normalised class matrix) -> pyarrow.Table of synthetic rows, chunk by chunk.

Every class in range(K) arrives (``GroupByClass``), also one with no records, and gets its T_k rows. The
device is picked once per worker.
"""
from __future__ import annotations

import logging
import os
import time

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics

from mechanisms.device import pick_device
from mechanisms.dpcda import mix_class
from mechanisms.plan import PlanError
from storage.shards import block_table

log = logging.getLogger(__name__)
# Test hook: fail the first attempt of each class's mixing after its first chunk (marker files in
# this directory record attempts). Used to show that a retried bundle yields identical rows.
FAULT_ENV = "DPCDA_TEST_FAIL_FIRST_MIX_DIR"


def check_build(expected: tuple | None) -> None:
    """A worker runs the code the launcher was built from (version, commit), or refuses to mix."""
    if expected is None:
        return
    from pipeline import __version__, build_commit

    here = (__version__, build_commit())
    if tuple(expected) != here:
        raise RuntimeError(f"worker code dpcda {here[0]}-{here[1]} does not match the launcher's "
                           f"{expected[0]}-{expected[1]}; use the worker image of the launcher's version")


class _MixFn(beam.DoFn):
    def __init__(self, device: str, chunk_rows: int, features_column: str, label_column: str,
                 soft_labels: bool = False, expected_build: tuple | None = None):
        self.device_pref, self.chunk_rows, self.soft_labels = device, chunk_rows, soft_labels
        self.fc, self.lc = features_column, label_column
        self.expected_build = expected_build
        self.rows_written = Metrics.counter("dpcda", "rows_synthesized")

    def setup(self):
        check_build(self.expected_build)
        self.device = pick_device(self.device_pref)

    def process(self, element, plan, key):
        k, x = element
        start = time.time()
        fault_dir = os.environ.get(FAULT_ENV)
        for i, (chunk, feats, labels) in enumerate(mix_class(
                x, key=key, class_index=k, num_classes=plan.num_classes, mode=plan.mode,
                mixing_order=plan.mixing_order, sigma_x=plan.sigma_x, samples=plan.samples_per_class,
                chunk_rows=self.chunk_rows, sampling_rate=plan.sampling_rates[k], sigma_y=plan.sigma_y,
                device=self.device, lowpass=plan.lowpass,
                soft_labels=self.soft_labels)):
            if fault_dir and i == 1:
                marker = os.path.join(fault_dir, f"class-{k}")
                if not os.path.exists(marker):
                    open(marker, "w").close()
                    raise RuntimeError(f"injected fault: first attempt of class {k}")
            if not (np.isfinite(feats).all() and np.isfinite(labels).all()):
                raise PlanError(f"class {k}: synthetic values are not finite (the statistics or bounds overflow the "
                                f"z-score); nothing was published")
            self.rows_written.inc(len(labels))
            yield block_table(feats, labels, self.fc, self.lc, soft=self.soft_labels)
        log.info("stage=mix class=%d rows=%d device=%s seconds=%.2f", k, plan.samples_per_class,
                 self.device, time.time() - start)


class MixWithinClass(beam.PTransform):
    """(k, float32 (N_k, d)) -> pyarrow.Table: T_k synthetic rows of class k."""

    def __init__(self, plan_pcoll, key_pcoll, *, device="auto", chunk_rows=4096,
                 features_column="features", label_column="label", soft_labels=False, expected_build=None):
        super().__init__()
        self.plan, self.key = plan_pcoll, key_pcoll
        self.fn = _MixFn(device, chunk_rows, features_column, label_column, soft_labels, expected_build)

    def expand(self, classes):
        return classes | "Mix" >> beam.ParDo(self.fn, beam.pvalue.AsSingleton(self.plan),
                                             beam.pvalue.AsSingleton(self.key))
