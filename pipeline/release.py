"""The release job: builds the Beam graph of DESIGN.md and publishes the release atomically.

    ReadShards -> ComputeGlobalStats -> Calibrate --(side inputs)--+
    ReadShards -> GroupByClass -> NormalizeAndClip -> MixWithinClass -> WriteSynthetic -> WriteManifest

Everything is written under a temporary sibling of OUTPUT and moved into place only after every
shard and the manifest are written; a failure leaves nothing at OUTPUT.
"""
from __future__ import annotations

import functools
import logging
import os
import time
import uuid

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from pipeline.manifest import build_manifest
from privacy.noise import fresh_key, key_from_test_seed
from schemas.config import ReleaseConfig
from schemas.manifest import InputInfo
from transforms.calibrate import Calibrate
from transforms.group import GroupByClass
from transforms.mix import MixWithinClass
from transforms.normalize import NormalizeAndClip
from transforms.read import ReadShards
from transforms.shards import InputError, detect_format, expand_glob, read_shard
from transforms.stats import ComputeGlobalStats
from transforms.write import MANIFEST, WriteManifest, WriteSynthetic

log = logging.getLogger("dpcda.release")


class ReleaseError(RuntimeError):
    """A release that cannot go ahead (existing output, unreadable input...)."""


def _noise_key(seed):
    return key_from_test_seed(seed) if seed is not None else fresh_key()


def _input_info(cfg: ReleaseConfig, files: list[str], fmt: str, dim: int) -> InputInfo:
    return InputInfo(pattern=cfg.input, format=fmt, files=len(files), features_column=cfg.features_column,
                     label_column=cfg.label_column, feature_dim=dim)


def _peek_dim(files: list[str], fmt: str, cfg: ReleaseConfig) -> int:
    """Feature width of the first row of the first non-empty shard (an empty shard among others is fine)."""
    for path in files:
        for block in read_shard(path, fmt, cfg.features_column, cfg.label_column, batch_rows=1):
            return int(block.features.shape[1])
    raise InputError(f"{cfg.input}: zero rows in the {len(files)} matching file(s)")


def build_pipeline(p: beam.Pipeline, cfg: ReleaseConfig, files: list[str], fmt: str, dim: int,
                   workdir: str, input_info: InputInfo):
    key = p | "NoiseKey" >> beam.Create([cfg.seed]) | "DrawKey" >> beam.Map(_noise_key)
    blocks = p | "ReadShards" >> ReadShards(
        files, fmt=fmt, features_column=cfg.features_column, label_column=cfg.label_column,
        bounds=cfg.feature_bounds, out_of_bounds=cfg.out_of_bounds, num_classes=cfg.num_classes, width=dim)
    stats = blocks | "ComputeGlobalStats" >> ComputeGlobalStats(cfg.feature_bounds)
    plan = stats | "Calibrate" >> Calibrate(cfg, key)
    synthetic = (blocks
                 | "GroupByClass" >> GroupByClass(plan)
                 | "NormalizeAndClip" >> NormalizeAndClip(plan)
                 | "MixWithinClass" >> MixWithinClass(plan, key, device=cfg.device, chunk_rows=cfg.chunk_rows,
                                                      features_column=cfg.features_column,
                                                      label_column=cfg.label_column,
                                                      soft_labels=cfg.soft_labels))
    files_written = synthetic | "WriteSynthetic" >> WriteSynthetic(
        workdir, dim, num_shards=cfg.output_shards, features_column=cfg.features_column,
        label_column=cfg.label_column, soft_classes=cfg.num_classes if cfg.soft_labels else None)
    return files_written | "WriteManifest" >> WriteManifest(
        workdir, plan, functools.partial(build_manifest, cfg, input_info))


COUNTERS = ("rows_read", "rows_rejected", "values_clipped_to_bounds", "rows_synthesized", "rows_written")


def _counters(result) -> dict:
    """The 'dpcda' Beam counters of a finished run, summed over steps (empty where the runner has none)."""
    from apache_beam.metrics.metric import MetricsFilter

    try:
        found = result.metrics().query(MetricsFilter().with_namespace("dpcda"))["counters"]
    except Exception:  # noqa: BLE001 - metrics are best effort; some runners do not report them
        return {}
    totals = dict.fromkeys(COUNTERS, 0)
    for c in found:
        value = c.committed if c.committed is not None else c.attempted
        totals[c.key.metric.name] = totals.get(c.key.metric.name, 0) + int(value or 0)
    return totals


def _has_release(output: str) -> bool:
    """Anything at OUTPUT (for gs://, any object under the prefix) counts as an existing release."""
    if "://" in output:
        return bool(FileSystems.match([output + "/**"])[0].metadata_list)
    return os.path.exists(output) and (not os.path.isdir(output) or bool(os.listdir(output)))


def _delete_tree(path: str) -> None:
    if "://" in path:
        matches = FileSystems.match([path.rstrip("/") + "/**"])[0].metadata_list
        if matches:
            FileSystems.delete([m.path for m in matches])
    elif os.path.exists(path):
        import shutil
        shutil.rmtree(path)


def _publish(workdir: str, output: str, overwrite: bool) -> None:
    """Move the finished release into place; the manifest arrives last."""
    if "://" not in output:
        old = None
        if os.path.exists(output):
            old = f"{output.rstrip('/')}.old-{uuid.uuid4().hex[:8]}"
            os.rename(output, old)
        try:
            os.rename(workdir, output)
        except BaseException:
            if old:
                os.rename(old, output)
            raise
        if old:
            _delete_tree(old)
        return
    if overwrite:
        _delete_tree(output)
    src = [m.path for m in FileSystems.match([workdir.rstrip("/") + "/**"])[0].metadata_list]
    src.sort(key=lambda s: s.endswith("/" + MANIFEST))
    FileSystems.rename(src, [output.rstrip("/") + s[len(workdir.rstrip("/")):] for s in src])
    _delete_tree(workdir)


def run_release(cfg: ReleaseConfig, beam_args: list[str], evaluate=None) -> dict:
    """Runs the whole release; returns the manifest as a dict. Raises on any failure, leaving OUTPUT as it was."""
    t0 = time.time()
    files = expand_glob(cfg.input)
    if not files:
        raise InputError(f"{cfg.input}: no input files match")
    fmt = detect_format(files[0], cfg.input_format)
    output = cfg.output.rstrip("/")
    if _has_release(output) and not cfg.overwrite:
        raise ReleaseError(f"{output}: a release already exists there; pass --overwrite to replace it")
    dim = _peek_dim(files, fmt, cfg)
    info = _input_info(cfg, files, fmt, dim)
    workdir = f"{output}.tmp-{uuid.uuid4().hex[:12]}"
    log.info("stage=start files=%d format=%s dim=%d mode=%s l=%d workdir=%s", len(files), fmt, dim, cfg.mode,
             cfg.mixing_order, workdir)
    options = PipelineOptions(beam_args)
    try:
        with beam.Pipeline(options=options) as p:
            build_pipeline(p, cfg, files, fmt, dim, workdir, info)
        import json
        with FileSystems.open(FileSystems.join(workdir, MANIFEST)) as fh:
            manifest = json.loads(fh.read())
        counts = " ".join(f"{k}={v}" for k, v in _counters(p.result).items())
        log.info("stage=pipeline rows=%d %s seconds=%.1f", manifest["output"]["rows"], counts, time.time() - t0)
        if evaluate is not None:
            manifest = evaluate(workdir, manifest)
        _publish(workdir, output, cfg.overwrite)
    except BaseException:
        _delete_tree(workdir)
        raise
    log.info("stage=done output=%s rows=%d epsilon=%s seconds=%.1f", output, manifest["output"]["rows"],
             manifest["privacy"]["epsilon"], time.time() - t0)
    return manifest
