"""Bad input and operations, held to the bad-input rule: one ``dpcda: error:`` line, exit 2, nothing partial
published, inputs unchanged, no private value in a message. Each test names the case it covers: the rows M1-M9 and
L1-L10 of the third bad-input campaign, and the operating cases (unquoted globs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import make_dataset, write_dataset

X, Y = make_dataset(n_per_class=10, num_classes=3, dim=4, seed=2)


def cli(capsys, *args) -> tuple[int, str]:
    """``dpcda ARGS`` in process; (exit status, stderr). A traceback fails the test."""
    from dpcda.pipeline.cli import main

    code = main([str(a) for a in args])
    err = capsys.readouterr().err
    assert "Traceback" not in err, err[-3000:]
    return code, err


def one_line(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.startswith("dpcda: error:")]
    assert len(lines) == 1, err[-3000:]
    return lines[0]


def listing(folder: Path) -> dict:
    """Every file under ``folder`` with its bytes: inputs unchanged, nothing partial left."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------- unquoted globs


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["release", "--input", "{a}", "{b}", "{c}", "--output", "{out}", "--epsilon", 1], "--input"),
        (
            ["release", "--input", "{g}", "--eval-input", "{a}", "{b}", "--output", "{out}", "--epsilon", 1],
            "--eval-input",
        ),
        (["schema", "infer", "--input", "{a}", "{b}", "--label", "label"], "--input"),
        (["evaluate", "--synthetic", "{out}", "--test", "{a}", "{b}", "{c}"], "--test"),
        (["audit-release", "--release", "{out}", "--train", "{a}", "{b}", "--holdout", "{g}"], "--train"),
    ],
)
def test_an_unquoted_glob_the_shell_expanded_is_answered_with_one_line_that_says_to_quote_it(
    tmp_path, capsys, argv, flag
):
    """``--input data/*.parquet`` unquoted reaches us as several paths; the ones after the first read as unknown
    (Beam) options. One line names the option and says to quote the pattern."""
    write_dataset(tmp_path / "in", X, Y, shards=3)
    a, b, c = sorted(str(p) for p in (tmp_path / "in").glob("*.parquet"))
    names = dict(a=a, b=b, c=c, g=str(tmp_path / "in" / "*.parquet"), out=str(tmp_path / "rel"))
    before = listing(tmp_path)
    code, err = cli(capsys, *[str(t).format(**names) for t in argv])
    line = one_line(err)
    assert code == 2 and f"{flag} takes one path or pattern but got" in line, line
    assert f"quote it, e.g. {flag} '{tmp_path / 'in' / '*.parquet'}'" in line
    assert listing(tmp_path) == before
