"""gs:// input and output against a local GCS emulator (gcp-storage-emulator) started by the test."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from tests.conftest import BEAM_ARGS, make_dataset

pytest.importorskip("gcp_storage_emulator.server")
pytestmark = pytest.mark.gcs


@pytest.mark.parametrize("fmt", ["parquet", "tfrecord"])
def test_release_reads_and_writes_gs(gcs, fmt):
    from apache_beam.io.filesystems import FileSystems

    from dpcda.pipeline.release import run_release
    from dpcda.schemas.config import load_config
    from dpcda.storage.publish import PublishError
    from dpcda.storage.shards import write_parquet, write_tfrecord

    x, y = make_dataset(n_per_class=20, num_classes=2, dim=6)
    writer = write_parquet if fmt == "parquet" else write_tfrecord
    writer(f"{gcs}/in/a.{fmt}", x[:20], y[:20])
    writer(f"{gcs}/in/b.{fmt}", x[20:], y[20:])
    cfg = load_config(None, {"input": f"{gcs}/in/*.{fmt}", "output": f"{gcs}/rel", "epsilon": 5.0, "seed": 1})
    manifest = run_release(cfg, BEAM_ARGS).model_dump(mode="json")
    assert manifest["output"]["rows"] == 40
    with FileSystems.open(f"{gcs}/rel/manifest.json") as fh:
        assert json.loads(fh.read())["output"]["rows"] == 40
    part = f"{gcs}/rel/" + manifest["output"]["files"][0]["path"]
    with FileSystems.open(part) as fh:
        assert pq.read_table(fh).num_rows == manifest["output"]["files"][0]["rows"]
    leftovers = [m.path for m in FileSystems.match([f"{gcs}/rel.tmp-*"])[0].metadata_list]
    assert leftovers == []
    with pytest.raises(PublishError, match="already exists"):
        run_release(cfg, BEAM_ARGS)
