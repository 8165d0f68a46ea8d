"""Which code this is: the package version and the git commit it was built from (checked launcher vs workers), and
what every worker checks before it draws noise (``WorkerBuild``: that code, and the noise threads the release asked
for). Each DoFn calls ``check_build`` in its ``setup``; a stage written as a ``beam.Map`` calls it first
(``checked``)."""

from __future__ import annotations

import functools
import os
import subprocess
from typing import NamedTuple, Optional

from dpcda._version import __version__ as VERSION


@functools.lru_cache(maxsize=1)
def build_commit() -> str:
    """The git commit this code was built from: baked into the worker image (``dpcda/storage/_build.py``, written by the
    Dockerfile), else read from the checkout, else 'unknown'."""
    try:
        from dpcda.storage._build import COMMIT  # type: ignore[import-not-found]

        return str(COMMIT)
    except ImportError:
        pass
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        out = subprocess.run(
            ["git", "-C", here, "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"


class WorkerBuild(NamedTuple):
    """What every worker checks in its DoFns' ``setup``: the launcher's code (version, commit), and the noise threads
    the release asked for (``--noise-threads``; None: the worker's own cores). No output depends on the count."""

    version: str
    commit: str
    noise_threads: Optional[int] = None


def check_build(expected: tuple | None) -> None:
    """A worker runs the code the launcher was built from (version, commit), or refuses to mix; it then draws its
    noise on the threads the release asked for (a ``WorkerBuild``'s ``noise_threads``)."""
    if expected is None:
        return
    from dpcda.privacy.noise import set_threads

    expected = WorkerBuild(*expected)
    here = (VERSION, build_commit())
    if expected[:2] != here:
        raise RuntimeError(
            f"worker code dpcda {here[0]}-{here[1]} does not match the launcher's "
            f"{expected[0]}-{expected[1]}; use the worker image of the launcher's version"
        )
    set_threads(expected.noise_threads)  # None: this worker's cores (a reused worker forgets an earlier release's)


def checked(fn, expected: tuple | None):
    """``fn`` for a ``beam.Map``, checking ``expected`` (a ``WorkerBuild``) once per process before its first call."""
    seen = []

    def call(*args, **kwargs):
        if not seen:
            check_build(expected)
            seen.append(True)
        return fn(*args, **kwargs)

    call.__name__ = getattr(fn, "__name__", "checked")
    return call
