"""The lock that keeps two runs from publishing to one local OUTPUT: ``flock`` on ``.NAME.dpcda-lock`` beside OUTPUT,
taken before the run writes anything and held until it has published or given up (released by the kernel if the
process dies). The run that holds it removes the file when done, so an output folder does not fill with lock files;
a dead run's file stays, unlocked, until the next run to that OUTPUT takes and removes it."""

from __future__ import annotations

import contextlib
import fcntl
import os
import time

TAKE_TRIES, TAKE_WAIT_SECONDS = 10, 0.05  # a lock held longer than half a second is a run's


def lock_path(out: str) -> str:
    parent, name = os.path.split(os.path.abspath(out))
    return os.path.join(parent, f".{name}.dpcda-lock")


def held(out: str) -> bool:
    """Whether a run holds OUTPUT's lock now (False when there is no lock file: a run removes it when done)."""
    try:
        fd = os.open(lock_path(out), os.O_RDONLY)
    except FileNotFoundError:
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
    """The lock file beside OUTPUT, created if absent, locked (``flock``) by this process; BlockingIOError while
    another run holds it, OSError when it cannot be created. The run that holds it removes it when done (``unlock``),
    so no lock file is left behind; a lock taken on a file that was removed meanwhile guards nothing, so the lock is
    taken again on the file now there."""
    path = lock_path(out)
    tries = TAKE_TRIES
    while True:
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            tries -= 1
            if tries <= 0:
                raise
            time.sleep(TAKE_WAIT_SECONDS)  # ``held`` takes the lock for an instant: a probe is not a run
            continue
        except BaseException:
            os.close(fd)
            raise
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
