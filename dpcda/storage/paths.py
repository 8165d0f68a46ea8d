"""Paths that may be local or remote (``gs://``): one test for which, one join, one reader/writer, one lister."""

from __future__ import annotations

import glob as _glob
import os
import posixpath
import stat

from dpcda.privacy.errors import DpcdaError


class InputError(DpcdaError, ValueError):
    """Bad input data: the message names the file, the column and (where it applies) the row."""


def is_remote(path: str) -> bool:
    return "://" in str(path)


def join(base: str, *parts: str) -> str:
    if is_remote(base):
        return posixpath.join(base.rstrip("/"), *parts)
    return os.path.join(base, *parts)


def open_file(path: str, mode: str = "rb"):
    if is_remote(path):
        from apache_beam.io.filesystems import FileSystems

        return FileSystems.open(path) if "r" in mode else FileSystems.create(path)
    return open(path, mode)


def exists(path: str) -> bool:
    if is_remote(path):
        from apache_beam.io.filesystems import FileSystems

        return FileSystems.exists(path)
    return os.path.exists(path)


def expand_glob(pattern: str) -> list[str]:
    """Sorted paths matching ``pattern`` (local or gs://); ``not_regular_files`` says which local ones are not files."""
    if is_remote(pattern):
        from apache_beam.io.filesystem import BeamIOError
        from apache_beam.io.filesystems import FileSystems

        try:
            return sorted(m.path for m in FileSystems.match([pattern])[0].metadata_list)
        except (BeamIOError, ValueError) as err:  # no credentials, no bucket, no network: one line
            cause = " ".join(str(err).split())[:240]
            raise InputError(f"{pattern}: cannot list the files ({type(err).__name__}: {cause})") from None
    return sorted(p for p in _glob.glob(pattern, recursive=True) if not p.endswith("/"))


def not_regular_files(paths: list[str]) -> list[str]:
    """Local paths among ``paths`` that are not regular files (directories; FIFOs, sockets, devices, whose reads
    can hang)."""
    out = []
    for p in paths:
        if is_remote(p):
            continue
        try:
            mode = os.stat(p).st_mode
        except OSError:
            out.append(p)
            continue
        if not stat.S_ISREG(mode):
            out.append(p)
    return out
