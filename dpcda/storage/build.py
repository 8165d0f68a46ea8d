"""Which code this is: the package version and the git commit it was built from (checked launcher vs workers)."""

from __future__ import annotations

import functools
import os
import subprocess

VERSION = "0.2.0"


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
