"""One-file outputs of the commands beside the release (``risk --plot``, ``schema infer --out``), under the release's
rules: never an input (by path, symbolic link or hard link), never a folder or a link, an existing file replaced
only with ``--overwrite`` and only when it is an earlier output of the same command (``ours`` decides from its
content), and written atomically (a temporary file in the same folder, then one rename): a reader sees the old file
or the new one, never half of one, and a failed write leaves nothing behind.
"""

from __future__ import annotations

import os
from typing import Callable, Iterable

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
            raise PublishError(f"{flag} {path}: not an earlier {what} of this command; refusing to replace it")
    return path


def write_file_output(path: str, write: Callable[[str], None], *, flag: str) -> None:
    """Calls ``write(tmp)`` on a temporary name beside ``path``, then renames it onto ``path``; an OSError is one
    PublishError line and leaves neither the temporary file nor a partial ``path``."""
    parent, name = os.path.split(os.path.abspath(path))
    tmp = os.path.join(parent, f".{name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except OSError as err:
        raise PublishError(f"{flag} {path}: cannot write ({err.strerror or type(err).__name__})") from None
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


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
    return path
