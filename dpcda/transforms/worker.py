"""What every worker checks before it draws noise: the launcher's code (version, commit), and the noise threads the
release asked for. Each DoFn calls ``check_build`` in its ``setup``; a stage written as a ``beam.Map`` calls it first
thing (``checked``)."""

from __future__ import annotations

from typing import NamedTuple, Optional

from dpcda.privacy.noise import set_threads


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
    from dpcda.storage.build import VERSION, build_commit

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
