"""Calibrate: FirstPass (+ noise key side input) -> ReleasePlan, a pure function of its inputs."""

from __future__ import annotations

import logging
import time

import apache_beam as beam

from dpcda.mechanisms.plan import build_plan
from dpcda.storage.build import checked

log = logging.getLogger(__name__)


def _plan(first, core, key, public_stats=None):
    start = time.time()
    plan = build_plan(first, core, key, public_stats)
    log.info(
        "stage=calibrate %s epsilon=%.4g delta=%g seconds=%.2f",
        plan.synthesis.summary(),  # what this mechanism's plan has: no sigma_x where it draws none
        plan.accounting.epsilon,
        plan.accounting.delta,
        time.time() - start,
    )
    return plan


class Calibrate(beam.PTransform):
    """FirstPass -> ReleasePlan (normalisation statistics, sigma_x, accounting). ``core``: the config's core settings
    (``ReleaseConfig.core``), all the plan reads."""

    def __init__(self, core, key_pcoll, public_stats=None, *, expected_build=None):
        super().__init__()
        self.core, self.key, self.public_stats, self.expected_build = core, key_pcoll, public_stats, expected_build

    def expand(self, first):
        plan = checked(_plan, self.expected_build)  # its noise (the histogram, the statistics) on the release's threads
        return first | "BuildPlan" >> beam.Map(plan, self.core, beam.pvalue.AsSingleton(self.key), self.public_stats)
