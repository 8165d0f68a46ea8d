"""Result files written whole or not at all: a benchmark killed mid-write leaves the previous file, never a cut one."""

from __future__ import annotations

import csv
import io
import os

# the repository and the one folder every benchmark writes its result files into (README.md there is the log)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")


def write_text(path: str, text: str) -> None:
    """``text`` to ``path`` through a temporary file in the same folder and one rename."""
    tmp = path + ".tmp"
    with open(tmp, "w", newline="") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def write_csv(path: str, fields, rows) -> None:
    """A CSV with header ``fields`` and the dicts ``rows``, written as ``write_text`` does."""
    buf = io.StringIO(newline="")
    w = csv.DictWriter(buf, fieldnames=list(fields))
    w.writeheader()
    w.writerows(rows)
    write_text(path, buf.getvalue())
