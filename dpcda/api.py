"""The Python API: a release and an accounting from Python, through the same code as ``dpcda release`` and
``dpcda account``.

    import dpcda

    rel = dpcda.release("data/wa_churn/train/*.parquet", epsilon=10, config="examples/wa_churn.yaml", seed=None)
    rel.table          # pyarrow.Table: the synthetic rows (a table release has the input's Arrow schema)
    rel.manifest       # dict: what is guaranteed (manifest.json: the JSON of the typed schemas.manifest.Manifest)
    rel.write("releases/wa-churn-eps10")

    dpcda.account(mechanism="dpcda", class_size=6000, samples_per_class=6000, mixing_order=16, epsilon=10)

``release`` runs the Beam job (DirectRunner in this process unless ``beam_args`` say otherwise) into ``output``, or
into a private temporary folder that ``Release.write`` publishes later under the same rules as the CLI (a release
of ours only is replaced, atomically, never the input).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import weakref
from typing import Any, Optional

DEFAULT_BEAM_ARGS = ("--runner=DirectRunner", "--direct_running_mode=in_memory")


@dataclasses.dataclass
class Release:
    """A published release: its folder, its manifest and (read on first use) its rows.

    ``manifest`` is the JSON of the typed manifest (``Manifest.model_dump(mode="json")``: what manifest.json holds),
    made once from the manifest the release published; ``write`` publishes that typed manifest (editing the dict
    changes nothing that is published)."""

    directory: str
    manifest: dict
    _table: Any = dataclasses.field(default=None, repr=False)
    _typed: Any = dataclasses.field(default=None, repr=False)  # the schemas.manifest.Manifest behind ``manifest``

    @classmethod
    def of(cls, directory: str, manifest) -> Release:
        """The Release of a typed ``Manifest`` published at ``directory``."""
        return cls(directory=directory, manifest=manifest.model_dump(mode="json"), _typed=manifest)

    @property
    def table(self):
        """The synthetic rows as one pyarrow Table (the parts in order)."""
        if self._table is None:
            import pyarrow as pa

            from dpcda.storage.paths import expand_glob, join, open_file
            from dpcda.storage.shards import parquet_file

            parts = expand_glob(
                join(self.directory, self.manifest["output"].get("prefix", ""), "synthetic", "*.parquet")
            )
            tables = []
            for path in parts:
                with open_file(path) as fh:
                    tables.append(parquet_file(fh, path).read())
            self._table = pa.concat_tables(tables)
        return self._table

    def write(self, path: str, *, overwrite: bool = False) -> str:
        """Publishes this release at local folder ``path`` (the CLI's rules: an existing ``path`` is replaced only
        with ``overwrite`` and only if it is a release of ours; its parent folder is created); returns ``path``."""
        from dpcda.storage import publish
        from dpcda.storage.paths import is_remote

        if is_remote(path) or is_remote(self.directory):
            raise publish.PublishError(f"{path}: write() copies local folders; give output= to release to gs://")
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        target = publish.prepare(path, overwrite=overwrite, inputs=[self.directory])
        try:
            for name in os.listdir(self.directory):
                if name in (publish.MANIFEST, publish.RUN_MARKER):
                    continue
                src, dst = os.path.join(self.directory, name), os.path.join(target.workdir, name)
                (shutil.copytree if os.path.isdir(src) else shutil.copy2)(src, dst)
            publish.publish(target, self._manifest())
        except BaseException:
            publish.abandon(target)
            raise
        return path

    def _manifest(self):
        """The typed manifest to publish: the release's own, or (a Release made from a dict) the dict validated."""
        from dpcda.schemas.manifest import Manifest

        return self._typed if self._typed is not None else Manifest.model_validate(self.manifest)


def release(
    source,
    *,
    epsilon: Optional[float] = None,
    mechanism: Optional[str] = None,
    schema=None,
    config: Optional[str] = None,
    output: Optional[str] = None,
    overwrite: bool = False,
    seed: Optional[int] = None,
    beam_args: Optional[list[str]] = None,
    **options,
) -> Release:
    """Releases ``source`` (a pyarrow Table, or a glob of Parquet/TFRecord shards, local or ``gs://``).

    ``schema``: a table's declaration (a ``TableSchema``, or the ``table:`` mapping of a config file); ``config``: a
    YAML/JSON config file, as ``--config``; ``options``: any other release field (``mixing_order=16``,
    ``mode="poisson"``, ``num_classes=10``, ``eval_input=...``), as the CLI's flags. ``seed`` is for tests only: the
    release is then reproducible and NOT private (its manifest says so). Raises the CLI's one-line errors
    (``dpcda.privacy.errors.DpcdaError`` subclasses).
    """
    from dpcda.pipeline.release import release_stages, run_release
    from dpcda.schemas.config import load_config

    keep: list = []
    if not isinstance(source, str):
        source = _write_table(source, keep)
    private = output is None
    if private:
        keep.append(tempfile.mkdtemp(prefix="dpcda-release-"))
        output = os.path.join(keep[-1], "release")
    fields = dict(options, input=source, output=output, epsilon=epsilon, mechanism=mechanism, seed=seed)
    fields.update(overwrite=overwrite or None, table=schema)
    try:
        cfg = load_config(config, fields)
        manifest = run_release(
            cfg,
            list(beam_args or DEFAULT_BEAM_ARGS),
            release_stages(cfg),
            eval_input=cfg.eval_input,
            protect=(config,) if config else (),
        )
    except BaseException:
        for folder in keep:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    rel = Release.of(output, manifest)
    rel.table  # read the rows now: a temporary input or release folder goes with the Release object
    for folder in keep:
        weakref.finalize(rel, shutil.rmtree, folder, True)
    return rel


def _write_table(table, keep: list) -> str:
    """A pyarrow Table (or anything ``pyarrow.table`` takes) as one Parquet shard in a private folder; its glob."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = table if isinstance(table, pa.Table) else pa.table(table)
    folder = tempfile.mkdtemp(prefix="dpcda-input-")
    keep.append(folder)
    pq.write_table(table, os.path.join(folder, "part-00000-of-00001.parquet"))
    return os.path.join(folder, "*.parquet")


def account(mechanism: str = "dpcda", **settings) -> dict:
    """``dpcda account`` from Python: one group's synthesis planned without data (``pipeline.accounting.account``,
    whose arguments it takes: ``class_size``, ``samples_per_class``, ``feature_dim``, ``num_classes`` and any release
    field, e.g. ``epsilon=10, mixing_order=16``), as a dict."""
    from dpcda.pipeline.accounting import account as plan_account

    return plan_account(mechanism, **settings)


__all__ = ["Release", "release", "account"]
