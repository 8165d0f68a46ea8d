"""The Python API: a release and an accounting from Python, through the same code as ``dpcda release`` and
``dpcda account``.

    import dpcda

    with dpcda.release("data/wa_churn/train/*.parquet", epsilon=10, config="examples/wa_churn.yaml") as rel:
        rel.table      # pyarrow.Table: the synthetic rows (a table release has the input's Arrow schema)
        rel.manifest   # dict: what is guaranteed (manifest.json: the JSON of the typed schemas.manifest.Manifest)
        rel.write("releases/wa-churn-eps10")

    dpcda.account(mechanism="dpcda", class_size=6000, samples_per_class=6000, mixing_order=16, epsilon=10)

    more = dpcda.load("releases/wa-churn-eps10").sample(50_000)   # a table release's model: post-processing

``release`` runs the Beam job (DirectRunner in this process unless ``beam_args`` say otherwise) into ``output``, or
into a private temporary folder that ``Release.write`` publishes later under the same rules as the CLI (a release
of ours only is replaced, atomically, never the input). Its errors are the CLI's one-line errors, in Python's words
(``dpcda.api_support``).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import weakref
from typing import Any, Optional

DEFAULT_BEAM_ARGS = ("--runner=DirectRunner", "--direct_running_mode=in_memory")


@dataclasses.dataclass(repr=False)
class Release:
    """A published release: its folder, its manifest and (read on first use) its rows.

    ``manifest`` is the JSON of the typed manifest (``Manifest.model_dump(mode="json")``: what manifest.json holds),
    made once from the manifest the release published; ``write`` publishes that typed manifest (editing the dict
    changes nothing that is published).

    A release made without ``output=`` lives in a private temporary folder, beside the private copy of an in-memory
    input: ``close()`` (or leaving a ``with`` block) removes them, as does collecting the object or the end of the
    process. ``table`` and ``manifest`` stay readable after ``close()``; ``write`` needs the folder."""

    directory: str
    manifest: dict
    _table: Any = None
    _typed: Any = None  # the schemas.manifest.Manifest behind ``manifest``
    _folders: tuple = ()  # private temporary folders this object owns (removed by close)
    _cleanup: Any = None

    def __post_init__(self):
        self._cleanup = weakref.finalize(self, _remove, tuple(self._folders))

    @classmethod
    def of(cls, directory: str, manifest, folders: tuple = ()) -> Release:
        """The Release of a typed ``Manifest`` published at ``directory``; ``folders``: temporary folders it owns."""
        return cls(directory=directory, manifest=manifest.model_dump(mode="json"), _typed=manifest, _folders=folders)

    def __repr__(self) -> str:
        p, m = self.manifest.get("privacy", {}), self.manifest.get("mechanism", {})
        state = ", closed" if self.closed else ""
        rows = self.manifest.get("output", {}).get("rows")
        return (
            f"Release({self.directory!r}, mechanism={m.get('name')!r}, rows={rows}, epsilon={p.get('epsilon')}, "
            f"delta={p.get('delta')}{state})"
        )

    def __enter__(self) -> Release:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return not self._cleanup.alive

    def close(self) -> None:
        """Removes the private temporary folders (the release's own, where no ``output=`` was given, and the copy of
        an in-memory input); the rows already read stay in ``table``. Idempotent."""
        self.table  # noqa: B018 - read while the parts are there
        self._cleanup()

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
        with ``overwrite=True`` and only if it is a release of ours; never inside this release's own folder; its
        parent folder is created); returns ``path``."""
        from dpcda.api_support import python_errors
        from dpcda.storage import publish
        from dpcda.storage.paths import is_remote

        with python_errors([]):  # the path it names is the caller's or this Release's directory: named as it is
            if is_remote(path) or is_remote(self.directory):
                raise publish.PublishError(f"{path}: write() copies local folders; give output= to release to gs://")
            if self.closed and any(_inside(self.directory, f) for f in self._folders):
                raise publish.PublishError("this Release was closed: its private folder is gone; nothing to write")
            if _inside(path, self.directory):
                raise publish.PublishError(
                    f"{path}: inside this release's own folder {self.directory}; write it somewhere else"
                )
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


def _remove(folders: tuple) -> None:
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


def _inside(path: str, directory: str) -> bool:
    p, d = os.path.realpath(path), os.path.realpath(directory)
    return p == d or p.startswith(d.rstrip(os.sep) + os.sep)


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
    """Releases ``source``; returns a ``Release`` (``.table``, ``.manifest``, ``.write(path)``; a context manager).

    ``source``: a glob string of Parquet or TFRecord shards (local or ``gs://``), a pyarrow Table or RecordBatch, a
    pandas DataFrame (its index is not data: it is dropped; write it as a column to keep it), or a mapping of
    column names to arrays. A table of named columns needs ``schema`` (or ``label``, below), its public declaration:
    a ``TableSchema`` or the ``table:`` mapping of a config file (docs/tables.md), e.g.

        schema = {
            "label": {"name": "churn", "categories": ["No", "Yes"]},   # class k is categories[k]
            "columns": [
                {"name": "tenure", "kind": "numeric", "lower": 0, "upper": 72},
                {"name": "contract", "kind": "categorical", "categories": ["Month-to-month", "One year"]},
                {"name": "senior", "kind": "boolean"},
            ],
        }
        rel = dpcda.release(df, epsilon=5, schema=schema)  # marginals under add/remove, a table's default

    Bounds and categories must be public facts about the domain, never read off the rows. ``label="churn"`` without a
    schema (or with a partial one) derives the rest in the release's DP domain step, for a share of the budget
    (``domain_budget_share``; ``drop_columns=["id"]`` leaves columns out). A table takes ``mechanism="marginals"``
    unless another is named (``mechanism="dpcda"`` mixes records; it needs a complete schema). ``config``: a YAML/JSON
    config file, as ``--config``; ``options``: any other release field (``mixing_order=16``, ``mode="poisson"``,
    ``num_classes=10``, ``eval_input=...``), as the CLI's flags. ``output``: publish there at once (else into a
    private folder, until ``Release.write``); ``overwrite=True`` replaces a release of ours there. ``seed`` is for
    tests only: the release is then reproducible and NOT private (its manifest says so). Raises the CLI's one-line
    errors (``dpcda.privacy.errors.DpcdaError`` subclasses), naming these keyword arguments.
    """
    import tempfile

    from dpcda.api_support import check_numbers, import_job, python_errors, source_glob

    import_job()
    from dpcda.pipeline.release import release_stages, run_release
    from dpcda.schemas.config import load_config

    keep: list = []
    try:
        with python_errors(keep):
            glob, name = source_glob(source, keep)
            private = output is None
            if private:
                keep.append(tempfile.mkdtemp(prefix="dpcda-release-"))
                output = os.path.join(keep[-1], "release")
            fields = dict(options, input=glob, output=output, epsilon=epsilon, mechanism=mechanism, seed=seed)
            fields.update(overwrite=overwrite or None, table=schema)
            check_numbers(fields)
            cfg = load_config(config, fields)
            manifest = run_release(
                cfg,
                list(beam_args or DEFAULT_BEAM_ARGS),
                release_stages(cfg),
                eval_input=cfg.eval_input,
                protect=(config,) if config else (),
                input_name=name,
            )
        rel = Release.of(output, manifest, tuple(keep))
        rel.table  # noqa: B018 - read the rows now: a temporary input or release folder goes with the Release object
    except BaseException:
        _remove(tuple(keep))
        raise
    try:
        return rel
    finally:  # this frame may outlive the call (``import_job``): it must not keep the Release and its folders alive
        del rel


def load(directory):
    """The model a published release keeps (``model/``; a table release of mechanism marginals), read and checked
    against its manifest: ``.sample(n, seed=None)`` draws ``n`` more rows as a pyarrow Table with the release's Arrow
    schema (post-processing: no budget, no ledger entry; the same ``seed`` gives the same rows, none gives fresh
    randomness), ``.manifest`` is the release's manifest (dict), ``.one_way_measurements()`` its noisy one-way counts.
    To publish a sample with its own manifest, use ``dpcda sample``. Raises a one-line ``DpcdaError`` for a folder
    that is not a release, a release without a model, or a model that was changed or truncated."""
    from dpcda.api_support import python_errors
    from dpcda.pipeline.sample import open_release

    with python_errors([]):
        return open_release(os.fspath(directory))


def account(mechanism: str = "dpcda", **settings) -> dict:
    """``dpcda account`` from Python: one group's synthesis planned without data (``pipeline.accounting.account``,
    whose arguments it takes: ``class_size``, ``samples_per_class``, ``feature_dim``, ``num_classes`` and any release
    field, e.g. ``epsilon=10, mixing_order=16``), as a dict."""
    from dpcda.pipeline.accounting import account as plan_account

    return plan_account(mechanism, **settings)


__all__ = ["Release", "release", "account", "load"]
