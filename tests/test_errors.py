"""One error type, one line: every user error ends in ``dpcda: error: ...`` and exit status 2, never a traceback.

Two halves: every error class the product defines is a ``DpcdaError`` (so the CLI boundary recognises it without a
list of names), and one real CLI run per kind of user error (bad flag value, bad input file, calibration that
cannot be met, failed evaluation) prints exactly one line that is not a log record.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

import pytest

from dpcda.privacy.errors import DpcdaError
from tests.conftest import make_dataset, run_cli, write_dataset

PACKAGES = ("privacy", "schemas", "storage", "mechanisms", "evaluation", "transforms", "pipeline")
LOG_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (DEBUG|INFO|WARNING) ")


def product_modules():
    for pkg in PACKAGES:
        mod = importlib.import_module(f"dpcda.{pkg}")
        yield mod
        for info in pkgutil.iter_modules(mod.__path__, prefix=f"dpcda.{pkg}."):
            yield importlib.import_module(info.name)


def test_every_error_class_of_the_product_is_a_dpcda_error():
    found = {}
    for mod in product_modules():
        for name, cls in inspect.getmembers(mod, inspect.isclass):
            # Exception, not BaseException: the CLI's SIGTERM signal (an interrupt, like KeyboardInterrupt) is not a
            # user error and has its own one-line report
            if cls.__module__ == mod.__name__ and issubclass(cls, Exception):
                found[f"{mod.__name__}.{name}"] = cls
    assert len(found) >= 10, sorted(found)  # the walk reached the packages
    strays = sorted(k for k, cls in found.items() if not issubclass(cls, DpcdaError))
    assert not strays, f"error classes outside the DpcdaError hierarchy (the CLI would print a traceback): {strays}"


def test_the_cli_knows_every_error_class_by_name():
    """A worker's error reaches the launcher as text only (multi-process runners, Dataflow): the CLI finds it by
    class name, so every DpcdaError subclass must be in its list."""
    from dpcda.pipeline.cli import _KNOWN

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    list(product_modules())  # import every module, so every subclass exists
    missing = sorted({c.__name__ for c in subclasses(DpcdaError)} - set(_KNOWN))
    assert not missing, f"dpcda.pipeline.cli._KNOWN lacks {missing}"


def the_one_line(res) -> str:
    """The error line of a finished CLI run; fails unless it is the only line besides log records."""
    assert res.returncode == 2, (res.returncode, res.stderr[-2000:])
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    lines = [ln for ln in res.stderr.splitlines() if ln.strip() and not LOG_RECORD.match(ln)]
    assert len(lines) == 1, res.stderr[-3000:]
    assert lines[0].startswith("dpcda: error: "), lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("errors")
    x, y = make_dataset(n_per_class=12, num_classes=2, dim=4, seed=3)
    write_dataset(d / "train", x, y, shards=1)
    write_dataset(d / "test", x, y, shards=1)
    return d


def release(data, *extra):
    return run_cli(
        "release",
        "--input",
        data / "train" / "*.parquet",
        "--output",
        data / "out",
        "--num-classes",
        2,
        "--mixing-order",
        2,
        "--runner=DirectRunner",
        "--direct_running_mode=in_memory",
        *extra,
    )


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--epsilon", "ten"], "epsilon"),  # the config field, which the flag spells with dashes
        (["--epsilon", "10", "--mixing-order", "0"], "mixing"),
        (["--epsilon", "10", "--no-such-flag", "1"], "--no-such-flag"),
        (["--epsilon", "10", "--mode", "sideways"], "mode"),
    ],
    ids=["not-a-number", "out-of-range", "unknown-flag", "bad-choice"],
)
def test_a_bad_flag_value_is_one_line(data, args, needle):
    line = the_one_line(release(data, *args))
    assert needle in line, line
    assert not (data / "out").exists()


def test_a_bad_input_file_is_one_line(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "part-0.parquet").write_text("this is not parquet\n")
    res = run_cli(
        "release",
        "--input",
        tmp_path / "in" / "*.parquet",
        "--output",
        tmp_path / "out",
        "--epsilon",
        "10",
        "--runner=DirectRunner",
        "--direct_running_mode=in_memory",
    )
    assert "part-0.parquet" in the_one_line(res)
    assert not (tmp_path / "out").exists()


def test_a_calibration_that_cannot_be_met_is_one_line(data):
    line = the_one_line(release(data, "--epsilon", "1e-12"))
    assert "epsilon" in line, line
    assert not (data / "out").exists()


def test_a_calibration_without_data_that_cannot_be_met_is_one_line():
    res = run_cli(
        "account", "--class-size", 100, "--samples-per-class", 100, "--mixing-order", 200, "--epsilon", 1, "--json"
    )
    assert "200" in the_one_line(res)


def test_a_failed_evaluation_is_one_line(data, tmp_path):
    (tmp_path / "rel" / "synthetic").mkdir(parents=True)  # a release folder without its parts
    res = run_cli("evaluate", "--synthetic", tmp_path / "rel", "--test", data / "test" / "*.parquet", "--runs", 1)
    assert "no synthetic Parquet files" in the_one_line(res)


def test_an_evaluation_on_a_test_set_of_the_wrong_width_is_one_line(data, tmp_path):
    x, y = make_dataset(n_per_class=5, num_classes=2, dim=9, seed=4)
    write_dataset(tmp_path / "wide", x, y, shards=1)
    res = release(data, "--epsilon", "10", "--eval-input", tmp_path / "wide" / "*.parquet", "--eval-epochs", 1)
    line = the_one_line(res)
    assert "9" in line and "4" in line, line
    assert not (data / "out").exists()
