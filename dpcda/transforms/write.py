"""WriteSynthetic (pyarrow.Table -> Parquet part files) and WriteDraftManifest (file names -> manifest draft).

The pipeline never writes ``manifest.json``: it writes a draft beside the parts, and ``storage.publish`` writes the
manifest when the release is published (``pipeline.release``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import posixpath

import apache_beam as beam
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from dpcda.mechanisms.normalization import NORMALIZATION_FILE, normalization_record
from dpcda.storage.paths import is_remote
from dpcda.storage.publish import DRAFT, MEASURED
from dpcda.storage.shards import parquet_schema

log = logging.getLogger(__name__)
NORMALIZATION = NORMALIZATION_FILE


class WriteSynthetic(beam.PTransform):
    """pyarrow.Table -> file names of ``DIR/synthetic/part-SSSSS-of-NNNNN.parquet`` (``schema``: a table release's
    Arrow schema, the input's)."""

    def __init__(
        self,
        directory,
        dim,
        *,
        num_shards=0,
        features_column="features",
        label_column="label",
        soft_classes=None,
        schema=None,
    ):
        super().__init__()
        self.prefix = FileSystems.join(directory, "synthetic", "part")
        self.schema = schema if schema is not None else parquet_schema(dim, features_column, label_column, soft_classes)
        self.num_shards = num_shards

    def expand(self, tables):
        return tables | "WriteParquet" >> beam.io.WriteToParquetBatched(
            self.prefix,
            self.schema,
            file_name_suffix=".parquet",
            num_shards=self.num_shards,
            shard_name_template="-SSSSS-of-NNNNN",
        )


def _sha256_rows_bytes(path: str, rows: bool = True) -> tuple[str, int, int]:
    """Read back from storage: what a reader will get (``rows``: a Parquet part's, from its footer; else 0)."""
    h = hashlib.sha256()
    size = 0
    with FileSystems.open(path) as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
            size += len(chunk)
    if not rows:
        return h.hexdigest(), 0, size
    with FileSystems.open(path) as fh:
        n = pq.ParquetFile(fh, pre_buffer=False).metadata.num_rows  # the footer only (storage.shards.parquet_file)
    return h.hexdigest(), n, size


def _write_text(path: str, text: str) -> None:
    with FileSystems.create(path) as fh:
        fh.write(text.encode())


def _write_manifest(files, plan, directory, prefix, build_manifest):
    from dpcda.schemas.manifest import OutputFile

    outputs = []
    for f in sorted(files):
        digest, rows, size = _sha256_rows_bytes(f)
        rel = f[len(directory.rstrip("/")) + 1 :] if is_remote(f) else posixpath.relpath(f, directory)
        outputs.append(OutputFile(path=prefix + rel, rows=rows, sha256=digest, bytes=size))
    model = _model_section(directory, prefix)
    if plan.z_scored:  # a release whose rows were not z-scored has no statistics to state
        _write_text(FileSystems.join(directory, NORMALIZATION), json.dumps(normalization_record(plan)) + "\n")
    measured = plan.synthesis.noisy_measurements()
    if measured is not None:  # DP counts for the quality report (evaluation.quality); publishing removes the draft
        _write_text(FileSystems.join(directory, MEASURED), json.dumps(measured, allow_nan=False) + "\n")
    manifest = build_manifest(plan, outputs, model=model)
    _write_text(FileSystems.join(directory, DRAFT), manifest.write_json())
    Metrics.counter("dpcda", "rows_written").inc(manifest.output.rows)
    log.info("stage=manifest files=%d rows=%d epsilon=%s", len(outputs), manifest.output.rows, manifest.privacy.epsilon)
    return manifest.output.rows


def _model_section(directory: str, prefix: str):
    """The manifest's ``model`` section where the synthesis kept its fitted model in ``DIR/model/``
    (``mechanisms.marginals.model``: its files, digested as read back), else None."""
    from dpcda.mechanisms.marginals import model
    from dpcda.schemas.manifest import ModelFile, ReleaseModel

    paths = [FileSystems.join(directory, model.MODEL_DIR, name) for name in model.MODEL_FILES]
    there = [FileSystems.exists(p) for p in paths]
    if not any(there):
        return None
    if not all(there):
        missing = [p for p, ok in zip(paths, there) if not ok]
        raise OSError(f"{missing[0]}: the model was written in part; nothing was published")
    files = []
    for name, path in zip(model.MODEL_FILES, paths):
        digest, _, size = _sha256_rows_bytes(path, rows=False)
        files.append(ModelFile(path=f"{prefix}{model.MODEL_DIR}/{name}", sha256=digest, bytes=size))
    return ReleaseModel(format=model.FORMAT, version=model.VERSION, files=files, contents=model.describe())


class WriteDraftManifest(beam.PTransform):
    """file names -> rows written; writes normalization.json (a release whose rows were z-scored), the noisy
    measurements' draft (a mechanism that has them: ``storage.publish.MEASURED``), then the manifest draft (paths
    prefixed for OUTPUT)."""

    def __init__(self, directory, plan_pcoll, build_manifest, prefix=""):
        super().__init__()
        self.directory, self.plan, self.build, self.prefix = directory, plan_pcoll, build_manifest, prefix

    def expand(self, file_names):
        return (
            file_names
            | "AllFiles" >> beam.combiners.ToList()
            | "Write"
            >> beam.Map(_write_manifest, beam.pvalue.AsSingleton(self.plan), self.directory, self.prefix, self.build)
        )
