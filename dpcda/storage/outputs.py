"""One-file outputs of the commands beside the release (``risk --plot``, ``schema infer --out``), under the release's
rules: never an input (by path, symbolic link or hard link), never a folder or a link, an existing file replaced
only with ``--overwrite`` and only when it is an earlier output of the same command (``ours`` decides from its
content), and written atomically (a temporary file in the same folder, then one rename): a reader sees the old file
or the new one, never half of one, and a failed write leaves nothing behind. The temporary file is created under a
random name with O_EXCL (``tempfile.mkstemp``: a link planted in the folder is never followed) and written through
its descriptor; where nothing may be replaced, the rename is ``renameat2(RENAME_NOREPLACE)`` (a file that appeared
meanwhile stays), and an allowed replacement checks the file once more just before the rename.
"""

from __future__ import annotations

import errno
import os
import tempfile
from typing import BinaryIO, Callable, Iterable, Optional

from dpcda.storage import publish
from dpcda.storage.paths import is_remote
from dpcda.storage.publish import PublishError


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def check_file_output(
    path: str,
    *,
    flag: str,
    overwrite: bool,
    ours: Callable[[str], bool],
    what: str,
    inputs: Iterable[str] = (),
) -> str:
    """``path`` once it may be written (checked before any work); PublishError, one line, when it may not."""
    path = str(path)
    if not path or path.endswith(("/", os.sep)) or os.path.basename(path) in (".", ".."):
        raise PublishError(f"{flag} {path!r}: name a file")
    if is_remote(path):
        raise PublishError(f"{flag} {path}: a local file (copy it to the bucket afterwards)")
    if any(_same_file(path, src) for src in inputs):
        raise PublishError(f"{flag} {path}: is an input; write it somewhere else")
    if os.path.islink(path):
        raise PublishError(f"{flag} {path}: is a symbolic link; give the real path")
    if os.path.lexists(path) and not os.path.isfile(path):
        raise PublishError(f"{flag} {path}: is a folder or not a regular file; name a file, e.g. {path}/{what}")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise PublishError(f"{flag} {path}: folder {os.path.dirname(path) or parent} does not exist")
    if os.path.exists(path):
        if not overwrite:
            raise PublishError(f"{flag} {path}: exists; pass --overwrite to replace it")
        if not ours(path):
            raise PublishError(
                f"{flag} {path}: not an earlier {what} of this command (or changed since); refusing to replace it"
            )
    return path


def write_file_output(
    path: str,
    write: Callable[[BinaryIO], None],
    *,
    flag: str,
    ours: Optional[Callable[[str], bool]] = None,
    what: str = "file",
    inputs: Iterable[str] = (),
) -> None:
    """Calls ``write(fh)`` on a new temporary file beside ``path`` (binary, opened from ``mkstemp``'s descriptor),
    then renames it onto ``path``. ``ours``: given when ``--overwrite`` allows replacing an earlier output of the
    command; the file at ``path`` is then checked again (``check_file_output``) just before the rename. Without it,
    or where ``path`` is absent, nothing is replaced: a file that appeared meanwhile is kept and the write refused.
    An OSError is one PublishError line and leaves neither the temporary file nor a partial ``path``."""
    parent, name = os.path.split(os.path.abspath(path))
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), 0o666 & ~_umask())  # the mode a plain open() would give
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        if ours is not None and os.path.lexists(path):
            check_file_output(path, flag=flag, overwrite=True, ours=ours, what=what, inputs=inputs)
            os.replace(tmp, path)
        else:
            _rename_noreplace(tmp, path, flag)
    except OSError as err:
        raise PublishError(f"{flag} {path}: cannot write ({err.strerror or type(err).__name__})") from None
    finally:
        if tmp is not None and os.path.lexists(tmp):
            os.unlink(tmp)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _rename_noreplace(tmp: str, path: str, flag: str) -> None:
    """``tmp`` to ``path`` only if ``path`` does not exist (renameat2, or a hard link where the system lacks it)."""
    try:
        if not publish._renameat2(tmp, path, publish.RENAME_NOREPLACE):
            os.link(tmp, path)  # fails if path exists; the caller removes tmp
    except OSError as err:
        if err.errno == errno.EEXIST:
            raise PublishError(f"{flag} {path}: appeared while it was written; it was kept, nothing written") from None
        raise


def check_dir_output(path: str, *, flag: str, inputs: Iterable[str] = ()) -> str:
    """A folder a command writes its files into (``evaluate --out``): never a file or a link, never a folder that
    holds an input (by real path). PublishError, one line, otherwise."""
    path = str(path).rstrip("/") or "/"
    if is_remote(path):
        return path
    if os.path.islink(path):
        raise PublishError(f"{flag} {path}: is a symbolic link; give the real path")
    if os.path.lexists(path) and not os.path.isdir(path):
        raise PublishError(f"{flag} {path}: is a file, not a folder")
    real = os.path.realpath(path)
    for src in inputs:
        if not is_remote(src) and os.path.commonpath([real, os.path.realpath(src)]) == real:
            raise PublishError(f"{flag} {path}: holds the input {src}; write somewhere else")
    existing = real
    while not os.path.exists(existing):  # the folder, or the nearest folder above it that the command would create
        existing = os.path.dirname(existing)
    if not os.access(existing, os.W_OK | os.X_OK):
        raise PublishError(f"{flag} {path}: {existing} is not writable")
    return path
