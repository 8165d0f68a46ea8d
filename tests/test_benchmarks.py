"""The reproduction script runs the real code paths end to end on a tiny slice and writes its table."""
from __future__ import annotations

import csv
import os

import pytest

from benchmarks.reproduce_table2 import main, parse_calibration

FASHION = "/usr/share/datasets/fashion-mnist"


def test_parse_calibration():
    assert parse_calibration("fixed") == ("fixed", None)
    assert parse_calibration("poisson+lp16") == ("poisson", 16)
    for bad in ("fixd", "fixed+16", "fixed+lpx", "paper+"):
        with pytest.raises(SystemExit, match="--calibrations"):
            parse_calibration(bad)


@pytest.mark.skipif(not os.path.exists(FASHION), reason="Debian's dataset-fashion-mnist is not installed")
def test_tiny_sweep_writes_table_csv_and_plot(tmp_path, capsys):
    main(["--limit", "400", "--ls", "2", "--eps", "10", "--calibrations", "fixed", "fixed+lp8", "--runs", "1",
          "--epochs", "1", "--device", "cpu", "--out", str(tmp_path), "--name", "t"])
    rows = list(csv.DictReader(open(tmp_path / "t.csv")))
    assert [r["calibration"] for r in rows] == ["fixed", "fixed+lp8"]
    # post-processing leaves the calibration alone: the same sigma_x with and without the low-pass
    assert rows[0]["sigma_x"] == rows[1]["sigma_x"] and float(rows[0]["sigma_x"]) > 0
    assert all(0.0 <= float(r["accuracy_mean"]) <= 1.0 for r in rows)
    assert (tmp_path / "t.png").stat().st_size > 0
    assert "fixed+lp8" in (tmp_path / "t.md").read_text()
    assert all(0.0 <= float(r["synthetic_val_accuracy"]) <= 1.0 for r in rows)


@pytest.mark.skipif(not os.path.exists(FASHION), reason="Debian's dataset-fashion-mnist is not installed")
def test_resume_keeps_finished_cells_and_runs_the_rest(tmp_path):
    base = ["--limit", "300", "--eps", "10", "--calibrations", "fixed", "--runs", "1", "--device", "cpu",
            "--out", str(tmp_path), "--name", "r"]
    main(base + ["--ls", "2", "--epochs", "1"])
    first = list(csv.DictReader(open(tmp_path / "r.csv")))
    main(base + ["--ls", "2", "4", "--epochs", "1", "--resume"])
    second = list(csv.DictReader(open(tmp_path / "r.csv")))
    assert [r["l"] for r in second] == ["2", "4"]
    assert second[0] == first[0]  # reused as written, not rerun
    main(base + ["--ls", "8", "--epochs", "1", "--resume"])  # cells not asked for are kept, not dropped
    assert [r["l"] for r in csv.DictReader(open(tmp_path / "r.csv"))] == ["2", "4", "8"]
    with pytest.raises(SystemExit, match="has runs, epochs, rows = \\(1, 1, 300\\), not \\(1, 2, 300\\)"):
        main(base + ["--ls", "2", "--epochs", "2", "--resume"])  # another protocol: refused, nothing lost
    assert len(list(csv.DictReader(open(tmp_path / "r.csv")))) == 3
    (tmp_path / "r.csv").write_text("calibration,eps,l\nfixed,10,2\n")  # an older format
    with pytest.raises(SystemExit, match="lacks sigma_x"):
        main(base + ["--ls", "2", "--epochs", "1", "--resume"])
