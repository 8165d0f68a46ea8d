"""What the Python API adds around the release job (``dpcda.api``): the kinds of ``source`` it takes, its keyword
arguments checked as Python values, and its errors in Python's words.

The job's messages are written for the command line (``--overwrite``, ``--config``, the ``table:`` section); from
Python they name the keyword arguments instead (``overwrite=True``, ``config=``, ``schema=``), and an in-memory table
is named as the caller's ``source``, never by the private temporary copy the job reads. A command the message
suggests (``'dpcda ledger cap ...'``) is a command line and is left as it is.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
from typing import Iterator, Optional

SOURCE_KINDS = (
    "a glob string of Parquet or TFRecord shards (local or gs://), a pyarrow Table or RecordBatch, a pandas "
    "DataFrame, or a mapping of column names to arrays"
)
IN_MEMORY = "(an in-memory table given to dpcda.release)"  # the manifest's input.pattern for one
SHARD = "part-00000-of-00001.parquet"  # the one shard an in-memory table is written to

# options whose name on the command line is not their keyword argument
_KEYWORDS = {"input": "source", "config": "config", "table": "schema"}


def source_glob(source, keep: list) -> tuple[str, Optional[str]]:
    """(the glob the job reads, the name the manifest gives it: None for the glob itself). An in-memory table is
    written as one Parquet shard into a private folder appended to ``keep``. InputError (one line, naming ``source``
    and the kinds it takes) for anything else: a list of paths, None, a number, bytes."""
    from dpcda.storage.paths import InputError

    if isinstance(source, os.PathLike):
        source = os.fspath(source)
    if isinstance(source, str):
        if not source:
            raise InputError(f"source: an empty string; give {SOURCE_KINDS}")
        return source, None
    if isinstance(source, (list, tuple)) and source and all(isinstance(s, (str, os.PathLike)) for s in source):
        raise InputError(
            f"source: a {type(source).__name__} of {len(source)} paths; give one glob string that matches the shards "
            f"(e.g. 'data/train/*.parquet'). source takes {SOURCE_KINDS}"
        )
    table = _as_table(source)
    if table is None:
        raise InputError(f"source: a {type(source).__name__}; give {SOURCE_KINDS}")
    if table.num_rows == 0:
        raise InputError("source: the table has no rows")
    import pyarrow.parquet as pq

    folder = tempfile.mkdtemp(prefix="dpcda-input-")
    keep.append(folder)
    pq.write_table(table, os.path.join(folder, SHARD))
    return os.path.join(folder, "*.parquet"), IN_MEMORY


def _as_table(source):
    """``source`` as a pyarrow Table, or None when it is none of the in-memory kinds. A pandas DataFrame's index is
    not data (a filtered frame's index would otherwise arrive as a column ``__index_level_0__``): it is dropped, and so
    is the schema metadata pandas adds."""
    import pyarrow as pa

    if isinstance(source, pa.Table):
        return source
    if isinstance(source, pa.RecordBatch):
        return pa.Table.from_batches([source])
    pandas = sys.modules.get("pandas")  # a DataFrame exists only where pandas was imported
    if pandas is not None and isinstance(source, pandas.DataFrame):
        return pa.Table.from_pandas(source, preserve_index=False).replace_schema_metadata(None)
    if isinstance(source, dict) and source and all(isinstance(k, str) for k in source):
        try:
            return pa.table(source)
        except (pa.ArrowException, TypeError, ValueError) as err:
            from dpcda.storage.paths import InputError

            raise InputError(f"source: a mapping that is not a table of columns ({str(err).splitlines()[0]})") from None
    return None


def import_job() -> None:
    """Imports the release job (Beam and what Beam imports) in a thread of its own, once. A library that keeps an
    exception from its import keeps every frame that was on the importing stack, with their locals (Beam imports
    google-cloud-bigquery, which keeps its ImportError for db_dtypes): on the caller's stack that kept the first
    Release of a process, its private folders and the caller's table alive until the process ended."""
    if "dpcda.pipeline.release" in sys.modules:
        return
    import importlib
    import threading

    failed: list = []

    def load():
        try:
            importlib.import_module("dpcda.pipeline.release")
        except BaseException as err:  # noqa: BLE001 - raised again in the caller's thread
            failed.append(err)

    thread = threading.Thread(target=load, name="dpcda-import")
    thread.start()
    thread.join()
    if failed:
        raise failed[0]


def check_numbers(fields: dict) -> None:
    """A release field that takes a number refuses True and False (``epsilon=True`` would be read as 1.0)."""
    from dpcda.schemas.config import ConfigError, ReleaseConfig

    for name, value in fields.items():
        field = ReleaseConfig.model_fields.get(name)
        if isinstance(value, bool) and field is not None and bool not in _types(field.annotation):
            raise ConfigError(f"{name}={value}: a number, not a bool")


def _types(annotation) -> set:
    """The classes an annotation allows (Optional[float] -> {float, NoneType})."""
    from typing import get_args

    args = get_args(annotation)
    return {annotation} if not args else set().union(*(_types(a) for a in args))


def in_python_words(text: str, folders: tuple = ()) -> str:
    """A message of the job as the API says it: command-line options as keyword arguments, the private copy of an
    in-memory table (in ``folders``) as ``source``. Quoted ``'dpcda ...'`` commands are left as they are."""
    for folder in folders:
        for name in (os.path.join(folder, SHARD), os.path.join(folder, "*.parquet")):
            text = text.replace(name, f"source {IN_MEMORY}")
        text = text.replace(os.path.join(folder, "release"), "the release's private folder")
    text = text.replace("in the table: section of a --config file", "with schema= (or in a config= file's table:)")
    text = text.replace("the table: section", "schema=")
    text = re.sub(r"(^|; )table\.", r"\1schema.", text)
    parts = re.split(r"('dpcda [^']*')", text)  # odd parts: a command line to run, kept as it is
    for i in range(0, len(parts), 2):
        parts[i] = re.sub(r"(?<![\w-])--([a-z][a-z0-9-]*)", _keyword, parts[i])
    return "".join(parts)


def _keyword(match: re.Match) -> str:
    from dpcda.pipeline.cli.release import FLAG_NAMES
    from dpcda.schemas.config import ReleaseConfig

    louder = {flag[2:]: field for field, flag in FLAG_NAMES.items()}  # a field whose flag is not its name
    name = louder.get(match.group(1), match.group(1).replace("-", "_"))
    if name == "input":
        return "source"
    field = ReleaseConfig.model_fields.get(name)
    if field is not None and bool in _types(field.annotation):
        return f"{_KEYWORDS.get(name, name)}=True"
    named = match.string[match.end() : match.end() + 1] == ":"  # "--config: x.yaml: ..." names the argument
    return _KEYWORDS.get(name, name) + ("" if named else "=")


@contextlib.contextmanager
def python_errors(folders: list) -> Iterator[None]:
    """The job's one-line errors (``DpcdaError``) raised in Python's words (``in_python_words``), without Beam's
    `` [while running 'Step']`` suffix, as the same exception. While it runs, Beam's own log record of a failed step
    (an ERROR with the whole traceback, printed before the exception reaches the caller) is held back: the caller
    gets the exception itself. Other exceptions pass as they are."""
    from dpcda.pipeline.cli.base import one_line_error
    from dpcda.privacy.errors import DpcdaError

    beam_log = logging.getLogger("apache_beam.runners.common")
    level = beam_log.level
    beam_log.setLevel(logging.CRITICAL)
    try:
        yield
    except DpcdaError as err:
        line = one_line_error(err) or str(err)
        err.args = (in_python_words(line, tuple(folders)),)
        raise
    finally:
        beam_log.setLevel(level)
