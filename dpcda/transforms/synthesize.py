"""Each mechanism's synthesis as one PTransform: records in, synthetic (features, label, scores) blocks out.

A mechanism names its PTransform here (``Mechanism.graph``); ``pipeline.release`` looks it up and applies it to the
read blocks, so the graph has no per-mechanism branches. Every one takes the same arguments: the plan and key side
inputs, the release config, the DP-PCA basis (or None) and the columns and build the workers check.
"""

from __future__ import annotations

import apache_beam as beam

from dpcda.transforms.group import GroupByClass, GroupDataset
from dpcda.transforms.mix import MixDataset, MixWithinClass, PerturbRecords
from dpcda.transforms.normalize import NormalizeAndClip, NormalizeDataset
from dpcda.transforms.p3gm import FitP3gm, SampleP3gm


class _Synthesis(beam.PTransform):
    """``stated_plan``: None, or (set by ``expand``) the plan completed with DP choices the synthesis made from the data
    (marginals' picked pairs), which the manifest states instead of the plan."""

    def __init__(self, plan, key, cfg, basis, common: dict, directory: str = ""):
        super().__init__()
        self.plan, self.key, self.cfg, self.basis, self.common = plan, key, cfg, basis, common
        self.directory = directory  # the run directory (a mechanism that keeps its fitted model writes it there)
        self.stated_plan = None


class MixClasses(_Synthesis):
    """DP-CDA: records grouped by class, normalised, mixed within their class (the in-memory path)."""

    def expand(self, blocks):
        cfg = self.cfg
        return (
            blocks
            | "GroupByClass" >> GroupByClass(self.plan)
            | "NormalizeAndClip" >> NormalizeAndClip(self.plan)
            | "MixWithinClass"
            >> MixWithinClass(
                self.plan,
                self.key,
                device=cfg.device,
                chunk_rows=cfg.chunk_rows,
                soft_labels=cfg.soft_labels,
                basis_pcoll=self.basis,
                **self.common,
            )
        )


class MixWholeDataset(_Synthesis):
    """DPMix: the whole dataset on one worker (when the plan keeps it in memory), mixed across classes."""

    def expand(self, blocks):
        cfg = self.cfg
        return (
            blocks
            | "KeepIfInMemory"
            >> beam.Filter(lambda _b, p: p.synthesis.mixing_paths[0] == "memory", beam.pvalue.AsSingleton(self.plan))
            | "GroupDataset" >> GroupDataset()
            | "NormalizeDataset" >> NormalizeDataset(self.plan)
            | "MixDataset"
            >> MixDataset(
                self.plan,
                self.key,
                device=cfg.device,
                chunk_rows=cfg.chunk_rows,
                basis_pcoll=self.basis,
                **self.common,
            )
        )


class FitAndSampleP3gm(_Synthesis):
    """P3GM: the model fitted on one worker, then sampled in chunks."""

    def expand(self, blocks):
        cfg = self.cfg
        model = (
            blocks
            | "GroupDataset" >> GroupDataset()
            | "NormalizeDataset" >> NormalizeDataset(self.plan)
            | "FitP3gm"
            >> FitP3gm(self.plan, self.key, self.basis, device=cfg.device, expected_build=self.common["expected_build"])
        )
        return model | "SampleP3gm" >> SampleP3gm(
            self.plan, self.key, chunk_rows=cfg.chunk_rows, device=cfg.device, **self.common
        )


class PerturbEveryRecord(_Synthesis):
    """Local perturbation and random projection: each block of records noised where it was read."""

    def expand(self, blocks):
        return blocks | "PerturbRecords" >> PerturbRecords(self.plan, self.key, **self.common)
