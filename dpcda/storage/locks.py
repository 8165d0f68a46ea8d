"""The lock that keeps two runs from publishing to one local OUTPUT: ``flock`` on ``.NAME.dpcda-lock`` beside OUTPUT,
taken before the run writes anything and held until it has published or given up (released by the kernel if the
process dies). The run that holds it removes the file when done, so an output folder does not fill with lock files;
a dead run's file stays, unlocked, until the next run to that OUTPUT takes and removes it."""

from __future__ import annotations

import contextlib
import fcntl
import os

from dpcda.storage.paths import is_remote


def lock_path(out: str) -> str:
    parent, name = os.path.split(os.path.abspath(out))
    return os.path.join(parent, f".{name}.dpcda-lock")


def output_busy(output: str) -> bool:
    """True while a release to the local OUTPUT holds its lock (a run is under way); False on GCS (no lock)."""
    from dpcda.storage.publish import check_output_path  # publish imports this module

    out = check_output_path(output)
    if is_remote(out):
        return False
    try:
        fd = os.open(lock_path(out), os.O_RDONLY)
    except FileNotFoundError:  # no run holds it (a run removes its lock file when done)
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def take(out: str) -> int:
    """The lock file beside OUTPUT, created if absent, locked (``flock``) by this process; PublishError while another
    run holds it. The run that holds it removes it when done (``unlock``), so no lock file is left behind; a lock
    taken on a file that was removed meanwhile guards nothing, so the lock is taken again on the file now there."""
    from dpcda.storage.publish import PublishError  # publish imports this module

    path = lock_path(out)
    while True:
        try:
            fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
        except OSError as err:
            raise PublishError(f"{out}: cannot create the lock file {path} ({err.strerror})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise PublishError(f"{out}: another release to this output is running; nothing was done") from None
        if _same_lock_file(fd, path):
            return fd
        os.close(fd)


def _same_lock_file(fd: int, path: str) -> bool:
    try:
        st, held = os.stat(path), os.fstat(fd)
    except FileNotFoundError:
        return False
    return (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino)


def unlock(target) -> None:
    """Removes the lock file (while still holding it: a run that opened it meanwhile then finds it gone and takes a
    new one, ``take``) and releases the lock."""
    if target.lock_fd is not None:
        try:
            path = lock_path(target.output)
            if _same_lock_file(target.lock_fd, path):
                with contextlib.suppress(OSError):
                    os.unlink(path)
            fcntl.flock(target.lock_fd, fcntl.LOCK_UN)
        finally:
            os.close(target.lock_fd)
            target.lock_fd = None
