"""More rows from a release's model, later: ``dpcda sample`` and ``dpcda.load(DIR).sample(n)``.

A marginals release keeps its fitted model as ``model/`` (``mechanisms.marginals.model``): DP measurements and what
was fitted to them, no row. Drawing from it is post-processing: no budget is spent, no ledger is opened, and the
sample's manifest (``schemas.sample_manifest``) points at the release's guarantee (its path, the SHA-256 of its
manifest, its epsilon and delta stated as inherited).

Reading (``open_release``): DIR's ``manifest.json`` must validate as a release's manifest and list a model; every
model file is read once, checked against the size and SHA-256 the manifest lists, then parsed with every name, dtype
and shape checked (``marginals.model.load_model``); anything else is one ``ModelError`` line.

Writing (``write_sample``): OUTPUT is published as a release is (``storage.publish``: its lock, a run directory, the
parts, the manifest last, one rename); an existing OUTPUT is replaced only with ``overwrite`` and only when it holds
a release or sample of ours; OUTPUT never lies inside DIR, nor DIR inside OUTPUT.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
from typing import Callable, Optional

from dpcda.mechanisms.marginals.model import MODEL_FILES, FittedModel, ModelError, load_model, sample_tables
from dpcda.privacy.errors import DpcdaError
from dpcda.schemas.mechanism_params import MAX_MODEL_SAMPLES

MAX_SAMPLE_ROWS = MAX_MODEL_SAMPLES  # rows one sample may ask for (drawn in parts of PART_ROWS: memory stays flat)
PART_ROWS = 1 << 18  # rows per Parquet part (and per draw of mbi's sampler)
SEED_PURPOSE = "model-sample"  # a --seed's key: privacy.noise.public_key(SEED_PURPOSE, seed)
HOW = (
    "mbi's synthetic_data (randomized rounding of the model's marginals) in blocks of {part} rows, MST's compressed "
    "codes spread uniformly back to their codes, the table's rules (if any) kept as the release kept them (the model "
    "conditioned on them, then the same rejection, repair and order-rule steps), a numeric code a value uniform "
    "inside its bin (an integer column: an integer inside it), then the release's decoding into its Arrow schema"
)


class SampleError(DpcdaError, ValueError):
    """A sample that cannot be drawn as asked (not a release, no model, a bad row count, a bad OUTPUT)."""


@dataclasses.dataclass(frozen=True, repr=False)
class ReleaseModel:
    """A release's saved model, checked: ``manifest`` (the release's manifest as JSON), ``model`` (the
    ``FittedModel``), where it was read from, and the SHA-256 of the manifest read."""

    directory: str
    manifest: dict
    manifest_sha256: str
    model: FittedModel
    files: tuple  # schemas.manifest.ModelFile of each model file read
    _mbi: dict = dataclasses.field(default_factory=dict, compare=False)  # mbi's model, made on the first sample

    def __repr__(self) -> str:
        p = self.manifest["privacy"]
        return f"ReleaseModel({self.directory!r}, epsilon={p.get('epsilon')}, delta={p.get('delta')})"

    def sample(self, n: int, seed: Optional[int] = None):
        """``n`` rows drawn from the model as one pyarrow Table with the release's Arrow schema (post-processing: no
        budget). ``seed``: the same seed gives the same rows; without it, fresh randomness."""
        import pyarrow as pa

        from dpcda.mechanisms.marginals.model import mbi_model

        rows = check_rows(n, "n")
        key = sample_key(check_seed(seed, "seed"))
        if "model" not in self._mbi:
            self._mbi["model"] = mbi_model(self.model)
        tables = list(sample_tables(self.model, rows, key, PART_ROWS, self._mbi["model"]))
        return pa.concat_tables(tables)

    def one_way_measurements(self) -> dict:
        """Column -> its noisy one-way counts and noise std (``FittedModel.one_way_measurements``; DP)."""
        return self.model.one_way_measurements()


def check_rows(n, what: str) -> int:
    """``n`` as a row count in [1, MAX_SAMPLE_ROWS]; SampleError naming ``what`` otherwise."""
    if isinstance(n, str):
        try:
            n = int(n.strip())
        except ValueError:
            raise SampleError(f"{what} must be an integer in [1, {MAX_SAMPLE_ROWS:,}], got {n!r}") from None
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_SAMPLE_ROWS:
        raise SampleError(f"{what} must be an integer in [1, {MAX_SAMPLE_ROWS:,}], got {n!r}")
    return n


def check_seed(seed, what: str) -> Optional[int]:
    if seed is None:
        return None
    if isinstance(seed, str):
        try:
            seed = int(seed.strip())
        except ValueError:
            raise SampleError(f"{what} must be a non-negative integer, got {seed!r}") from None
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise SampleError(f"{what} must be a non-negative integer, got {seed!r}")
    return seed


def sample_key(seed: Optional[int]) -> bytes:
    """The key every draw of a sample comes from: a fresh secret one, or with ``seed`` a public one anyone can rebuild
    (the model is DP: sampling it touches no private data, so a known key reveals nothing more)."""
    from dpcda.privacy.noise import fresh_key, public_key

    return fresh_key() if seed is None else public_key(SEED_PURPOSE, seed)


def _read(path: str) -> Optional[bytes]:
    from dpcda.storage.paths import open_file

    try:
        with open_file(path) as fh:
            return fh.read()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None
    except OSError as err:
        raise SampleError(f"{path}: cannot read ({err.strerror or type(err).__name__})") from None


def open_release(directory: str) -> ReleaseModel:
    """The model of the release at ``directory`` (local or gs://), checked (module docstring)."""
    from pydantic import ValidationError

    from dpcda.schemas.manifest import Manifest
    from dpcda.storage.paths import is_remote, join
    from dpcda.storage.publish import MANIFEST

    directory = str(directory).rstrip("/") or "/"
    if not is_remote(directory):
        directory = os.path.abspath(directory)
    raw = _read(join(directory, MANIFEST)) if is_remote(directory) or os.path.isdir(directory) else None
    if raw is None:
        raise SampleError(f"{directory}: not a release (no {MANIFEST}); give the folder of a published release")
    data = None
    try:
        data = json.loads(raw)
        manifest = Manifest.model_validate(data)
    except (ValueError, ValidationError):
        if isinstance(data, dict) and data.get("kind") == "sample":
            src = (data.get("source") or {}).get("path")
            raise SampleError(f"{directory}: a sample, not a release; draw from its release {src} instead") from None
        raise SampleError(f"{directory}: not a release (its {MANIFEST} does not validate)") from None
    if manifest.model is None:
        raise SampleError(
            f"{directory}: this release keeps no model (mechanism {manifest.mechanism.name}); only a table release "
            "of mechanism marginals keeps one (model/) to sample more rows from"
        )
    prefix = manifest.output.prefix
    blobs = {}
    for f in manifest.model.files:
        name = f.path[len(prefix) :].split("/", 1)[-1] if f.path.startswith(prefix) else f.path.split("/", 1)[-1]
        if name not in MODEL_FILES or name in blobs:
            raise ModelError(f"{directory}: the manifest lists a model file {f.path!r} of no known kind")
        data_bytes = _read(join(directory, f.path))
        if data_bytes is None:
            raise ModelError(f"{join(directory, f.path)}: missing; the model is incomplete, nothing was sampled")
        if len(data_bytes) != f.bytes or hashlib.sha256(data_bytes).hexdigest() != f.sha256:
            raise ModelError(
                f"{join(directory, f.path)}: differs from the manifest ({len(data_bytes)} bytes; its size or SHA-256 "
                "is not the one listed); the model was changed or truncated, nothing was sampled"
            )
        blobs[name] = data_bytes
    fm = load_model(blobs, join(directory, "model"))
    stated = (manifest.input.table or {}).get("arrow_schema")
    if stated is not None and [(c["name"], c["type"]) for c in stated] != [
        (f.name, str(f.type)) for f in fm.arrow_schema
    ]:
        raise ModelError(f"{directory}/model: its Arrow schema is not the release's; nothing was sampled")
    return ReleaseModel(
        directory=directory,
        manifest=manifest.model_dump(mode="json"),
        manifest_sha256=hashlib.sha256(raw).hexdigest(),
        model=fm,
        files=tuple(manifest.model.files),
    )


def _inside(path: str, directory: str) -> bool:
    p, d = os.path.realpath(path), os.path.realpath(directory)
    return p == d or p.startswith(d.rstrip(os.sep) + os.sep)


def check_output(output: str, directory: str) -> str:
    """OUTPUT once it may be written: a local folder, not inside the release (nor holding it)."""
    from dpcda.storage.paths import is_remote

    out = str(output)
    if is_remote(out):
        raise SampleError(f"--output {out}: a local folder (copy the sample to the bucket afterwards)")
    if not is_remote(directory) and _inside(out, directory):
        raise SampleError(f"--output {out}: inside the release {directory}; write the sample somewhere else")
    return out


def write_sample(
    release: ReleaseModel,
    rows,
    output: str,
    *,
    overwrite: bool = False,
    seed: Optional[int] = None,
    on_published: Optional[Callable[[], None]] = None,
) -> "SampleManifest":  # noqa: F821 - schemas.sample_manifest, imported inside
    """Draws ``rows`` rows from ``release``'s model and publishes them at ``output`` (``synthetic/`` and a
    ``manifest.json`` written last); returns the typed ``SampleManifest``. ``on_published``: called once they are
    published (the CLI's word on a later interrupt); an exception raised after they became visible (an interrupt
    during the old output's clean-up) carries ``published = True``."""
    import pyarrow.parquet as pq

    from dpcda.pipeline.manifest import software
    from dpcda.privacy import noise
    from dpcda.progress import track
    from dpcda.schemas.manifest import Output, OutputFile
    from dpcda.schemas.sample_manifest import SampleDraw, SampleManifest, SamplePrivacy, SampleSource
    from dpcda.storage import publish

    n = check_rows(rows, "--rows")
    seed = check_seed(seed, "--seed")
    out = check_output(output, release.directory)
    target = publish.prepare(out, overwrite=overwrite, inputs=[release.directory])
    try:
        parts = -(-n // PART_ROWS)
        os.mkdir(os.path.join(target.workdir, "synthetic"))
        files = []
        with track("sample rows drawn", n, unit="rows") as bar:
            for k, table in enumerate(sample_tables(release.model, n, sample_key(seed), PART_ROWS)):
                rel = f"synthetic/part-{k:05d}-of-{parts:05d}.parquet"
                path = os.path.join(target.workdir, rel)
                pq.write_table(table, path)
                size = os.path.getsize(path)
                files.append(OutputFile(path=rel, rows=table.num_rows, sha256=_sha256(path), bytes=size))
                bar.update(table.num_rows)
        m, p = release.manifest, release.manifest["privacy"]
        manifest = SampleManifest(
            created_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            software=software(),
            source=SampleSource(
                path=release.directory,
                manifest_sha256=release.manifest_sha256,
                created_at=m["created_at"],
                mechanism=m["mechanism"]["name"],
                model=list(release.files),
            ),
            privacy=SamplePrivacy(
                epsilon=p["epsilon"],
                delta=p["delta"],
                neighbouring_relation=p["neighbouring_relation"],
                end_to_end_dp=p["end_to_end_dp"],
                statement=f"post-processing of release {release.directory} (manifest sha256 "
                f"{release.manifest_sha256}): rows drawn from its model, which holds DP measurements and what was "
                "fitted to them, no row; no budget spent, the guarantee is that release's",
            ),
            sampling=SampleDraw(
                rows=sum(f.rows for f in files),
                reproducible_seed=seed is not None,
                generator=noise.GENERATOR,
                how=HOW.format(part=PART_ROWS),
            ),
            output=Output(
                rows=sum(f.rows for f in files),
                files=files,
                format="parquet: the release's columns and Arrow types (its input.table.arrow_schema)",
            ),
        )
        publish.publish(target, manifest)
        if on_published is not None:
            on_published()
    except BaseException as err:
        publish.abandon(target)
        if target.published:
            err.published = True  # the CLI must not say "nothing was published"
        raise
    return manifest


def _sha256(path: str) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()
