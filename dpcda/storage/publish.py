"""Publishing a release: OUTPUT only ever goes from nothing, or one complete release of ours, to another.

The rules, for both kinds of OUTPUT:
- An existing OUTPUT is replaced only with ``--overwrite`` and only if it holds a release of ours (a
  ``manifest.json`` that validates). An input file inside OUTPUT, a foreign directory or file, or a symlink is
  never replaced or deleted.
- Two runs cannot both publish to one OUTPUT: locally the second run finds an exclusive lock and stops at once;
  on GCS the manifest is written with a generation precondition, so the second writer fails and publishes nothing.
- The job writes under its own run directory; the manifest is written last; the old release is removed only after
  the new one is in place. Stale run directories of dead runs are removed by the next run.

Local (``prepare`` -> job writes ``OUTPUT.tmp-<run>`` -> ``publish``): ``OUTPUT.tmp-<run>/manifest.json`` is
written last (a temporary name, then a rename), every listed part is checked, and the directory then takes
OUTPUT's place in one ``renameat2`` call: RENAME_NOREPLACE onto an absent OUTPUT, RENAME_EXCHANGE with an old
release, which then sits at the run directory's name and is deleted. A reader of OUTPUT sees either the old
complete release or the new complete release, never a mix, never nothing. (Where the kernel or file system lacks
renameat2, the old release is renamed aside first: OUTPUT is absent for the moment between two renames.) The lock
is ``flock`` on ``.NAME.dpcda-lock`` beside OUTPUT, held for the whole run, released by the kernel if the process
dies; the run removes the file when done (a dead run's file stays, unlocked, until the next run to OUTPUT).

GCS (``gs://B/P``): the job writes under ``P/runs/<run>/`` (a new prefix per run, never rewritten). ``publish``
checks that every listed part exists with the size the manifest records (its sha256 was computed from the stored
object), then writes ``P/manifest.json`` as one object with ``if_generation_match`` set to the generation seen
when the run started (0: must not exist). Readers start from ``P/manifest.json``: they see the old manifest, whose
parts are still in place, or the new one, whose parts were verified before it was written. The previous release's
objects are deleted only after the new manifest is in place. Run prefixes not referenced by the manifest and
older than ``STALE_RUN_HOURS`` plus a clock-skew margin (``CLOCK_SKEW_HOURS``; by the time in their name) are deleted
at the start of the next run.
"""

from __future__ import annotations

import ctypes
import dataclasses
import datetime
import errno
import json
import logging
import os
import re
import shutil
import uuid
from typing import TYPE_CHECKING, Optional

from dpcda.privacy.errors import DpcdaError
from dpcda.storage import locks
from dpcda.storage.paths import is_remote

if TYPE_CHECKING:
    from dpcda.schemas.manifest import Manifest

log = logging.getLogger(__name__)
MANIFEST = "manifest.json"
DRAFT = "manifest.draft.json"  # what the pipeline writes; only ``publish`` writes MANIFEST
MEASURED = "measurements.draft.json"  # a mechanism's noisy measurements for the quality report; never published
DRAFTS = (MEASURED, DRAFT)
RUNS = "runs"
STALE_RUN_HOURS = 72
# Launchers' clocks differ, by up to this much (assumed). A sweep removes a run prefix only once it is older than
# STALE_RUN_HOURS + this by the sweeper's clock (so older than STALE_RUN_HOURS by any clock within the margin,
# the run's own included); a failed run counts as possibly swept from STALE_RUN_HOURS - this on, by its own clock
# (a sweeper whose clock runs ahead sees it older; one without the margin, of an older version, sweeps at 72 h).
CLOCK_SKEW_HOURS = 24
RUN_MARKER = ".dpcda-run"  # written into every local run directory: only such directories are ever swept
_RUN_ID = re.compile(r"\d{8}T\d{6}Z-[0-9a-f]{8}")


class PublishError(DpcdaError, RuntimeError):
    """OUTPUT cannot be written or replaced safely; the message says why and what to do."""


@dataclasses.dataclass
class Target:
    """One run's claim on OUTPUT, from ``prepare`` to ``publish`` or ``abandon``."""

    output: str
    overwrite: bool
    run_id: str
    workdir: str  # where the job writes
    prefix: str  # the run directory relative to OUTPUT ('' locally: the directory itself becomes OUTPUT)
    lock_fd: Optional[int] = None
    generation: int = 0  # GCS: generation of OUTPUT/manifest.json when the run started (0: none)
    old_manifest: Optional[dict] = None
    published: bool = False  # set the moment the release became visible: from then on nothing may undo it
    # GCS: set by ``abandon`` when a part of this run may have been readable (``exposed_on_gcs``): its ledger
    # reservation must then keep counting
    exposed: bool = False
    # set by the launcher the moment the pipeline has returned (its parts are written): every later failure is exposed
    written: bool = False


def _run_id() -> str:
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{now}-{uuid.uuid4().hex[:8]}"


def _run_age_hours(run_id: str) -> Optional[float]:
    try:
        t = datetime.datetime.strptime(run_id.split("-")[0], "%Y%m%dT%H%M%SZ").replace(tzinfo=datetime.timezone.utc)
    except ValueError:
        return None
    return (datetime.datetime.now(datetime.timezone.utc) - t).total_seconds() / 3600


def check_output_path(output: str) -> str:
    """OUTPUT without a trailing slash, a local parent resolved; refuses '', '/', '.', '..' and bucket roots."""
    out = str(output).rstrip("/")
    name = out.rsplit("/", 1)[-1]
    if not out or name in ("", ".", "..") or (is_remote(out) and out.count("/") < 3):
        raise PublishError(f"output: {output!r} is not a release directory; name one, e.g. releases/fm-eps10")
    if not is_remote(out):  # one spelling of OUTPUT, so one lock and one set of run directories
        out = os.path.join(os.path.realpath(os.path.dirname(os.path.abspath(out))), os.path.basename(out))
    return out


def validate_manifest(text: str | bytes, where: str) -> dict:
    """The manifest as a dict if it validates against the model (a release's, or a sample's: ``dpcda sample``), else
    PublishError."""
    from dpcda.schemas.manifest import Manifest
    from dpcda.schemas.sample_manifest import SampleManifest

    try:
        data = json.loads(text)
        (SampleManifest if isinstance(data, dict) and data.get("kind") == "sample" else Manifest)(**data)
    except Exception:  # noqa: BLE001 - any failure means: not a release of ours
        raise PublishError(
            f"{where}: not a release of ours (no valid {MANIFEST}); refusing to replace it, move it "
            f"away or choose another --output"
        ) from None
    return data


def _inside(path: str, directory: str) -> bool:
    if is_remote(path) != is_remote(directory):
        return False
    if is_remote(path):
        return path == directory or path.startswith(directory + "/")
    p, d = os.path.realpath(path), os.path.realpath(directory)
    return p == d or p.startswith(d.rstrip(os.sep) + os.sep)


def prepare(output: str, *, overwrite: bool, inputs: list[str]) -> Target:
    """Checks OUTPUT, takes the lock (local) or notes the manifest generation (GCS), creates the run directory."""
    out = check_output_path(output)
    inside = [p for p in inputs if _inside(p, out)]
    if inside:
        raise PublishError(f"{out}: input {inside[0]} lies inside the output; a release never writes over its input")
    if not is_remote(out):
        return _prepare_local(out, overwrite)
    from google.api_core import exceptions as gexc
    from google.auth import exceptions as auth_exc

    try:
        return _prepare_gcs(out, overwrite)
    except (gexc.GoogleAPIError, auth_exc.GoogleAuthError) as err:  # no credentials, no bucket, no permission
        raise PublishError(f"{out}: {type(err).__name__}: {str(err).splitlines()[0][:200]}") from None


def publish(target: Target, manifest: Manifest) -> None:
    """Makes the run's release visible at OUTPUT (see the module docstring); the manifest goes in last.

    ``manifest`` is the typed, assembled manifest (``pipeline.manifest.assemble``): it was validated when the launcher
    read the draft and as each section was added; here it is only written (``Manifest.write_json``). A sample drawn
    from a release's model (``pipeline.sample``) publishes its ``SampleManifest`` the same way."""
    from dpcda.schemas.manifest import Manifest
    from dpcda.schemas.sample_manifest import SampleManifest

    if not isinstance(manifest, (Manifest, SampleManifest)):
        raise TypeError(f"publish: takes the typed Manifest, not {type(manifest).__name__}")
    text = manifest.write_json()
    if is_remote(target.output):
        _publish_gcs(target, manifest, text)
    else:
        _publish_local(target, manifest, text)


def abandon(target: Optional[Target], err: Optional[BaseException] = None) -> None:
    """Removes the run's directory and releases the lock; OUTPUT is left as it was. After the switch (``published``)
    the run's files ARE the release and are kept; what is left of the old one goes with the next run. On GCS it
    first decides ``target.exposed`` (``exposed_on_gcs``) from ``err``, the error that ended the run."""
    if target is None:
        return
    try:
        if target.published:
            return
        if is_remote(target.output):
            target.exposed = True  # until shown otherwise, also if the check below is interrupted
            target.exposed = exposed_on_gcs(target, err)
            try:
                _delete_gcs_prefix(target.workdir)
            except Exception as gone:  # noqa: BLE001 - what stays is swept later; the run's own error stands
                target.exposed = True  # parts may stay readable until then
                log.warning("stage=abandon could not delete %s (%s); a later run removes it", target.workdir, gone)
        elif os.path.isdir(target.workdir):
            shutil.rmtree(target.workdir, ignore_errors=True)
    finally:
        locks.unlock(target)


def _after_switch(what: str, fn, *args) -> None:
    """Clean-up after the release became visible: best effort, never reported as a failed release."""
    try:
        fn(*args)
    except Exception as err:  # noqa: BLE001 - the release is published; leftovers go with the next run
        log.warning("stage=publish %s failed (%s); the next run to this output removes what is left", what, err)


# ---------------------------------------------------------------- local

_libc = ctypes.CDLL(None, use_errno=True)
_AT_FDCWD = -100
RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2


def _renameat2(src: str, dst: str, flags: int) -> bool:
    """renameat2(2); False where the system does not offer it (then the caller falls back)."""
    fn = getattr(_libc, "renameat2", None)
    if fn is None:
        return False
    if fn(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), src, None, dst)


def output_busy(output: str) -> bool:
    """True while a release to the local OUTPUT holds its lock (a run is under way); False on GCS (no lock)."""
    out = check_output_path(output)
    return not is_remote(out) and locks.held(out)


def _prepare_local(out: str, overwrite: bool) -> Target:
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent):
        what = "is not a directory" if os.path.exists(parent) else "does not exist"
        raise PublishError(f"{out}: the parent folder {parent} {what}")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise PublishError(f"{out}: the parent folder {parent} is not writable")
    if os.path.islink(out):
        raise PublishError(f"{out}: is a symbolic link; give the real path")
    try:
        fd = locks.take(out)
    except BlockingIOError:
        raise PublishError(f"{out}: another release to this output is running; nothing was done") from None
    except OSError as err:
        raise PublishError(f"{out}: cannot create the lock file {locks.lock_path(out)} ({err.strerror})") from None
    target = Target(output=out, overwrite=overwrite, run_id=_run_id(), workdir="", prefix="", lock_fd=fd)
    try:
        _remove_stale_local(out)
        target.old_manifest = _existing_local(out, overwrite)
        target.workdir = f"{out}.tmp-{target.run_id}"
        os.mkdir(target.workdir)
        with open(os.path.join(target.workdir, RUN_MARKER), "w") as fh:
            fh.write(target.run_id + "\n")
    except BaseException:
        locks.unlock(target)
        raise
    return target


def _existing_local(out: str, overwrite: bool) -> Optional[dict]:
    """What stands at OUTPUT: None (nothing), or the manifest of a release of ours that ``overwrite`` allows replacing;
    PublishError naming what is there otherwise (a file, a folder that is not a release, a release without
    ``--overwrite``)."""
    if not os.path.lexists(out):
        return None
    if not os.path.isdir(out):
        raise PublishError(f"{out}: is a file, not a release; refusing to replace it, choose another --output")
    path = os.path.join(out, MANIFEST)
    try:
        if not os.path.isfile(path):
            old = validate_manifest(b"", out)
        else:
            with open(path, "rb") as fh:
                old = validate_manifest(fh.read(), out)
    except PublishError:
        try:
            what = "a folder that is not a release of ours" if os.listdir(out) else "an empty folder"
        except OSError:
            what = "a folder that is not a release of ours"
        raise PublishError(
            f"{out}: {what} (no valid {MANIFEST}); refusing to replace it, move it away or choose another --output"
        ) from None
    if not overwrite:
        raise PublishError(f"{out}: a release already exists there; pass --overwrite to replace it")
    return old


def _our_run_dirs(out: str, mark: str) -> list[str]:
    """Sibling directories ``OUTPUT<mark><run id>`` that carry our run marker (never anything else)."""
    parent, name = os.path.split(out)
    found = []
    for entry in os.listdir(parent):
        path = os.path.join(parent, entry)
        if (
            entry.startswith(name + mark)
            and _RUN_ID.fullmatch(entry[len(name + mark) :])
            and os.path.isdir(path)
            and not os.path.islink(path)
            and os.path.isfile(os.path.join(path, RUN_MARKER))
        ):
            found.append(path)
    return sorted(found)


def _remove_stale_local(out: str) -> None:
    """Run directories of dead runs (we hold the lock, so no live run owns one). A run that had renamed the old
    release aside (no renameat2) and died before moving the new one in left OUTPUT absent: the old release comes
    back first."""
    olds = _our_run_dirs(out, ".old-")
    if olds and not os.path.lexists(out) and os.path.isfile(os.path.join(olds[-1], MANIFEST)):
        log.warning("stage=publish restoring %s: a run died while replacing it", out)
        os.rename(olds[-1], out)
        os.remove(os.path.join(out, RUN_MARKER))
        olds = olds[:-1]
    for path in olds + _our_run_dirs(out, ".tmp-"):
        log.info("stage=publish removing stale %s", os.path.basename(path))
        shutil.rmtree(path, ignore_errors=True)


def _check_parts(manifest: Manifest, read_size) -> None:
    model = getattr(manifest, "model", None)  # a release's fitted model (model/), where it keeps one
    for f in [*manifest.output.files, *(model.files if model is not None else ())]:
        size = read_size(f.path)
        if size is None:
            raise PublishError(f"{f.path}: part missing before publishing; nothing was published")
        if f.bytes is not None and size != f.bytes:
            raise PublishError(f"{f.path}: part has {size} bytes, the manifest says {f.bytes}; nothing was published")


def _publish_local(target: Target, manifest: Manifest, text: str) -> None:
    work, out = target.workdir, target.output

    def size(rel):
        p = os.path.join(work, rel)
        return os.path.getsize(p) if os.path.isfile(p) else None

    _check_parts(manifest, size)
    for name in DRAFTS:
        if os.path.exists(os.path.join(work, name)):
            os.remove(os.path.join(work, name))
    tmp = os.path.join(work, f".{MANIFEST}.tmp")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, os.path.join(work, MANIFEST))
    # OUTPUT may have changed since the run started (not through dpcda: we hold the lock): check again.
    current = _existing_local(out, target.overwrite)
    if current is None:
        if not _renameat2(work, out, RENAME_NOREPLACE):
            if os.path.lexists(out):
                raise PublishError(f"{out}: appeared while the job ran; nothing was published")
            os.rename(work, out)
        target.published = True
    elif _renameat2(work, out, RENAME_EXCHANGE):
        target.published = True
        _after_switch("removing the old release", shutil.rmtree, work)  # the old release, at the run's name now
    else:
        old = f"{out}.old-{target.run_id}"
        with open(os.path.join(out, RUN_MARKER), "w") as fh:  # so that the aside copy can be recognised
            fh.write(target.run_id + "\n")
        os.rename(out, old)
        try:
            os.rename(work, out)
        except BaseException:
            os.rename(old, out)
            os.remove(os.path.join(out, RUN_MARKER))
            raise
        target.published = True
        _after_switch("removing the old release", shutil.rmtree, old)
    # the run marker came along (a run that dies before the switch must leave a marked directory to sweep)
    _after_switch("removing the run marker", os.remove, os.path.join(out, RUN_MARKER))
    _after_switch("syncing the output folder", _fsync_dir, os.path.dirname(out))
    locks.unlock(target)


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# ---------------------------------------------------------------- GCS


def gcs_client():
    """A google-cloud-storage client (anonymous against an emulator named by STORAGE_EMULATOR_HOST)."""
    from google.cloud import storage

    if os.environ.get("STORAGE_EMULATOR_HOST"):
        return storage.Client.create_anonymous_client()
    return storage.Client()


def split_gs(path: str) -> tuple[str, str]:
    if not path.startswith("gs://"):
        raise PublishError(f"{path}: only local paths and gs:// are supported for output")
    bucket, _, name = path[len("gs://") :].partition("/")
    return bucket, name.rstrip("/")


def _prepare_gcs(out: str, overwrite: bool) -> Target:
    bucket_name, prefix = split_gs(out)
    bucket = gcs_client().bucket(bucket_name)
    blob = bucket.get_blob(f"{prefix}/{MANIFEST}")
    run_id = _run_id()
    target = Target(
        output=out,
        overwrite=overwrite,
        run_id=run_id,
        workdir=f"{out}/{RUNS}/{run_id}",
        prefix=f"{RUNS}/{run_id}/",
        generation=int(blob.generation) if blob else 0,
    )
    if blob is not None:
        target.old_manifest = validate_manifest(blob.download_as_bytes(), out)  # what is there, before --overwrite
        if not overwrite:
            raise PublishError(f"{out}: a release already exists there; pass --overwrite to replace it")
    else:
        listing = bucket.list_blobs(prefix=f"{prefix}/", delimiter="/")  # the prefix's own objects and folders
        foreign = [b.name for b in listing]
        foreign += [p for p in listing.prefixes if p != f"{prefix}/{RUNS}/"]
        if foreign:
            raise PublishError(
                f"{out}: holds objects but no release {MANIFEST} (e.g. gs://{bucket_name}/"
                f"{sorted(foreign)[0]}); refusing to write there"
            )
    _remove_stale_gcs(bucket, prefix, target.old_manifest)
    return target


def _referenced_run(manifest: Optional[dict]) -> Optional[str]:
    pre = (manifest or {}).get("output", {}).get("prefix") or ""
    return pre.strip("/").split("/")[-1] if pre.startswith(f"{RUNS}/") else None


def _remove_stale_gcs(bucket, prefix: str, current: Optional[dict]) -> None:
    keep = _referenced_run(current)
    runs: dict[str, list] = {}
    for b in bucket.list_blobs(prefix=f"{prefix}/{RUNS}/"):
        run = b.name[len(prefix) + len(RUNS) + 2 :].split("/")[0]
        runs.setdefault(run, []).append(b)
    for run, blobs in runs.items():
        age = _run_age_hours(run)
        if run != keep and age is not None and age > STALE_RUN_HOURS + CLOCK_SKEW_HOURS:
            log.info("stage=publish removing stale run %s (%.0f h old)", run, age)
            for b in blobs:
                b.delete()


def exposed_in(err: Optional[BaseException]) -> bool:
    """Whether ``err``, or an error it was raised during (a second interrupt while ``abandon`` ran), carries
    ``exposed = True`` (set from ``Target.exposed`` by the launcher)."""
    seen, chain = err, 0
    while seen is not None and chain < 50:
        if getattr(seen, "exposed", False):
            return True
        seen, chain = seen.__cause__ or seen.__context__, chain + 1
    return False


def exposed_on_gcs(target: Target, err: Optional[BaseException]) -> bool:
    """Whether a failed GCS run may have had a part readable under ``OUTPUT/runs/<run>/`` (readers who may list the
    bucket could have copied it): the ledger then keeps counting the run at its target epsilon.

    Not exposed only when all hold: (1) the pipeline had not returned (``target.written`` is False: once it has,
    its parts were readable, and an empty prefix now proves nothing: another run's clean-up, a lifecycle rule or a
    stage may have removed them since), (2) the run is younger than ``STALE_RUN_HOURS - CLOCK_SKEW_HOURS`` (older,
    another run, perhaps on a launcher whose clock runs ahead of ours, may have swept its prefix), (3) the run's
    prefix holds no object now, and (4) the run ended in one of our own errors (a ``DpcdaError`` in ``err``'s
    chain), with no interrupt in it. Our errors reach here once the runner has stopped
    (the DirectRunner raises after its workers stop; a Dataflow job's failure is raised once the job is in a
    terminal state), so no worker writes after the listing. An interrupt, a polling error or anything unknown may
    leave a remote job running while the launcher cancels it: exposed. A listing that fails: exposed."""
    from dpcda.privacy.errors import DpcdaError

    if target.written:
        return True
    age = _run_age_hours(target.run_id)
    if age is None or age >= STALE_RUN_HOURS - CLOCK_SKEW_HOURS:
        return True
    ours, seen, chain = False, err, 0
    while seen is not None and chain < 50:
        if isinstance(seen, KeyboardInterrupt):
            return True
        ours = ours or isinstance(seen, DpcdaError)
        seen, chain = seen.__cause__ or seen.__context__, chain + 1
    if not ours:
        return True
    try:
        bucket_name, prefix = split_gs(target.workdir)
        listing = gcs_client().bucket(bucket_name).list_blobs(prefix=prefix.rstrip("/") + "/", max_results=1)
        if any(True for _ in listing):
            return True
    except Exception:  # noqa: BLE001 - cannot tell: count it
        return True
    age = _run_age_hours(target.run_id)  # again: a sweep may have come while the listing ran
    return age is None or age >= STALE_RUN_HOURS - CLOCK_SKEW_HOURS


def _delete_gcs_prefix(path: str) -> None:
    from google.api_core import exceptions as gexc

    bucket_name, prefix = split_gs(path)
    bucket = gcs_client().bucket(bucket_name)
    for b in bucket.list_blobs(prefix=prefix.rstrip("/") + "/"):
        try:
            b.delete()
        except gexc.NotFound:  # another run removed it first
            pass


def _publish_gcs(target: Target, manifest: Manifest, text: str) -> None:
    from google.api_core import exceptions as gexc

    bucket_name, prefix = split_gs(target.output)
    bucket = gcs_client().bucket(bucket_name)

    def size(rel):
        blob = bucket.get_blob(f"{prefix}/{rel}")
        return None if blob is None else int(blob.size)

    _check_parts(manifest, size)
    for name in DRAFTS:
        draft = bucket.get_blob(f"{prefix}/{target.prefix}{name}")
        if draft is not None:
            draft.delete()
    try:
        bucket.blob(f"{prefix}/{MANIFEST}").upload_from_string(
            text, content_type="application/json", if_generation_match=target.generation
        )
    except gexc.PreconditionFailed:
        # The client retries an upload whose response was lost; its retry then fails the precondition although the
        # first attempt wrote the object. Ours if the stored manifest is ours, to the byte.
        current = bucket.get_blob(f"{prefix}/{MANIFEST}")
        if current is None or current.download_as_bytes() != text.encode():
            raise PublishError(
                f"{target.output}: another release was published there while this job ran; nothing was published"
            ) from None
    target.published = True
    old = target.old_manifest
    if old is not None:
        old_run = _referenced_run(old)
        if old_run is not None and old_run != target.run_id:
            _after_switch("removing the old release", _delete_gcs_prefix, f"{target.output}/{RUNS}/{old_run}")
        elif old_run is None:  # a release laid out at OUTPUT itself: remove what it listed
            _after_switch("removing the old release", _delete_listed, bucket, prefix, old)


def _delete_listed(bucket, prefix: str, manifest: dict) -> None:
    for f in manifest["output"]["files"]:
        b = bucket.get_blob(f"{prefix}/{f['path']}")
        if b is not None:
            b.delete()
