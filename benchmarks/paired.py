"""A change's cost read in one run: this tree and another git revision timed alternately, and the paired table."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@contextlib.contextmanager
def revision_tree(rev: str, prefix: str = "bench-"):
    """(path of git revision ``rev`` checked out in a temporary worktree, a scratch folder beside it); both removed
    on exit."""
    tmp = tempfile.mkdtemp(prefix=prefix)
    tree = os.path.join(tmp, "ref")
    subprocess.run(["git", "-C", HERE, "worktree", "add", "--detach", tree, rev], check=True, capture_output=True)
    shim_old_layout(tree)
    try:
        yield tree, tmp
    finally:
        subprocess.run(["git", "-C", HERE, "worktree", "remove", "--force", tree], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


OLD_TOP_LEVEL = ("pipeline", "transforms", "mechanisms", "storage", "schemas", "privacy", "evaluation")


def shim_old_layout(tree: str) -> None:
    """A revision from before the one-package layout (top-level ``pipeline/``, ``privacy/``, ...) gets a ``dpcda/``
    of links to them, so ``python -m dpcda.pipeline.cli`` and ``from dpcda.privacy import ...`` run its code."""
    pkg = os.path.join(tree, "dpcda")
    if os.path.exists(pkg) or not os.path.isdir(os.path.join(tree, "pipeline")):
        return
    os.mkdir(pkg)
    Path(pkg, "__init__.py").touch()
    for name in OLD_TOP_LEVEL:
        if os.path.isdir(os.path.join(tree, name)):
            os.symlink(os.path.join("..", name), os.path.join(pkg, name))


def print_paired(title: str, times: dict[str, list[float]], unit: str, digits: int) -> None:
    """Markdown table of each tree's runs, mean, and mean over the first tree's mean."""
    first = next(iter(times.values()))
    ref = sum(first) / len(first)
    print(f"\n{title}\n")
    print(f"| tree | {unit} (each run) | mean | / reference |")
    print("|---|---|---:|---:|")
    for name, ts in times.items():
        mean = sum(ts) / len(ts)
        print(f"| {name} | {', '.join(f'{t:.{digits}f}' for t in ts)} | {mean:.{digits}f} | {mean / ref:.2f} |")
