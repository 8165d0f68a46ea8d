"""Progress of long work (``dpcda.progress``): a bar on a terminal, at most ten plain lines per stage elsewhere (no
carriage return, done/total, rate, eta), nothing when off; the evaluation's training, AIM's rounds, the audit's trials
and the in-process rows report through it, on stderr only."""

from __future__ import annotations

import io
import json
import logging
import re

import numpy as np
import pytest

from dpcda import progress
from tests.conftest import run_cli

LINE = re.compile(r"^dpcda: progress: (?P<what>.+): (?P<done>[\d,.]+)/(?P<total>[\d,.]+) .* eta=(\?|\d+:\d\d:\d\d)")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def plain_stderr(monkeypatch):
    """No DPCDA_PROGRESS from the environment, and lines straight to stderr (no logging set up by an earlier test)."""
    monkeypatch.delenv(progress.ENV, raising=False)
    level = progress.log.level
    progress.log.setLevel(logging.WARNING)  # setLevel, not the attribute: it clears the logger's cache
    yield
    progress.log.setLevel(level)


def progress_lines(err: str, what: str = "") -> list:
    return [ln for ln in err.splitlines() if ln.startswith("dpcda: progress: ") and what in ln]


def test_off_a_terminal_a_stage_writes_at_most_ten_plain_lines_with_done_total_rate_and_eta():
    out = io.StringIO()
    with progress.track("mix rows", 10_000, unit="rows", stream=out) as bar:
        for _ in range(1000):
            bar.update(10)
    text = out.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert len(lines) == 10, lines
    for i, ln in enumerate(lines, 1):
        m = LINE.match(ln)
        assert m and m["what"] == "mix rows", ln
        assert int(m["done"].replace(",", "")) == 1000 * i and m["total"] == "10,000"
        assert "rate=" in ln and f"({10 * i}%)" in ln
    assert lines[-1].endswith("eta=0:00:00")


def test_uneven_updates_write_one_line_per_tenth_crossed_and_nothing_past_the_end():
    out = io.StringIO()
    bar = progress.track("audit trials", 7, unit="trials", stream=out)
    for _ in range(7):
        bar.update(1)
    bar.update(3)  # a retried batch counted twice: no line past 100 %
    bar.set(5)
    bar.close()
    lines = out.getvalue().splitlines()
    assert 1 <= len(lines) <= 10 and len(set(lines)) == len(lines)
    assert "7/7 trials (100%)" in lines[-1]


def test_set_moves_to_a_share_and_the_postfix_is_shown():
    out = io.StringIO()
    bar = progress.track("AIM rounds", 100, unit="%", stream=out)
    for r, spent in enumerate([12.5, 15, 40, 99.5, 100], 1):
        bar.set(spent, round=r)
    lines = out.getvalue().splitlines()
    assert [ln.split(": ")[3].split()[0] for ln in lines] == ["12.5/100", "40/100", "99.5/100", "100/100"]
    assert lines[-1].endswith("round=5")


def test_a_terminal_gets_tqdms_bar_and_the_variable_overrides_the_choice(monkeypatch):
    tty = Terminal()
    bar = progress.track("evaluate", 100, unit="rows", stream=tty)
    assert type(bar).__name__ == "_Bar" and type(bar.bar).__module__.startswith("tqdm")
    bar.update(50)
    bar.close()
    assert "\r" in tty.getvalue()
    monkeypatch.setenv(progress.ENV, "lines")
    assert progress.chosen_mode(stream=Terminal()) == "lines"
    monkeypatch.setenv(progress.ENV, "bar")
    assert progress.chosen_mode(stream=io.StringIO()) == "bar"
    monkeypatch.setenv(progress.ENV, "sometimes")  # unknown: named once on stderr, the terminal decides
    assert progress.chosen_mode(stream=Terminal()) == "bar" and progress.chosen_mode(stream=io.StringIO()) == "lines"
    with pytest.raises(ValueError, match="bar, lines, off"):
        progress.track("x", 1, mode="loud")


@pytest.mark.parametrize("how", ["variable", "argument"])
def test_off_writes_nothing(monkeypatch, capsys, how):
    if how == "variable":
        monkeypatch.setenv(progress.ENV, "off")
    for stream in (io.StringIO(), Terminal()):
        with progress.track("x", 10, stream=stream, mode="off" if how == "argument" else None) as bar:
            for _ in range(10):
                bar.update(1, loss=1.0)
        assert stream.getvalue() == ""
    assert capsys.readouterr() == ("", "")


def test_lines_go_through_logging_where_it_shows_info_records(monkeypatch, capsys):
    """The CLI sets the package's loggers to INFO with one stderr handler: the lines are log records then, in the
    scheduler's one format; where logging would drop them (no handler, or not INFO) they go to stderr themselves."""
    records = io.StringIO()
    handler = logging.StreamHandler(records)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    monkeypatch.setattr(progress.log, "handlers", [handler])
    monkeypatch.setattr(progress.log, "propagate", False)
    for level, to_log in ((logging.INFO, True), (logging.WARNING, False)):
        progress.log.setLevel(level)
        with progress.track("mix rows", 4, unit="rows", mode="lines") as bar:
            bar.update(4)
        err = capsys.readouterr().err
        line = "progress: mix rows: 4/4 rows (100%)"
        if to_log:
            assert records.getvalue().startswith(f"INFO dpcda.progress: {line}") and err == ""
        else:
            assert err.startswith(f"dpcda: {line}") and records.getvalue().count("\n") == 1


def test_the_step_callback_never_shows_the_loss(capsys):
    cb = progress.step_callback("p3gm training", mode="lines")
    for step in range(50, 501, 50):
        cb(step, 500, 0.918273645)  # a sentinel no rate or time prints (rates are short figures)
    err = capsys.readouterr().err
    lines = progress_lines(err, "p3gm training")
    assert len(lines) == 10 and "500/500 steps" in lines[-1]
    assert "918273" not in err and "loss" not in err


def test_the_evaluations_training_reports_lines_not_carriage_returns(capsys):
    """A scheduler's log held 142 KB of tqdm frames from one evaluation: now at most ten lines, on stderr."""
    from dpcda.evaluation.train import train_and_score

    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 240)
    x = rng.normal(size=(240, 8)).astype(np.float32) + y[:, None]
    train_and_score(x, y, x[:60], y[:60], num_classes=3, runs=2, epochs=3, device="cpu", probe=False, model="mlp")
    out, err = capsys.readouterr()
    assert out == "" and "\r" not in err
    lines = progress_lines(err, "evaluate 2x3 epochs on cpu")
    assert 1 <= len(lines) <= 10 and len(progress_lines(err)) == len(lines), err
    assert "(100%)" in lines[-1] and "loss=" in lines[-1]
    for ln in lines:
        assert LINE.match(ln), ln


def test_aim_rounds_report_the_share_of_rho_spent(capsys, monkeypatch):
    from dpcda.mechanisms import marginals as mg
    from dpcda.privacy.events import AimEvent
    from dpcda.privacy.noise import key_from_test_seed

    monkeypatch.setattr(mg.aim, "AIM_ROUND_ITERS", 5)
    dom = mg.Domain(("a", "b", "y"), (4, 3, 2), 4)
    rng = np.random.default_rng(0)
    codes = np.stack([rng.integers(0, 4, 300), rng.integers(0, 3, 300), rng.integers(0, 2, 300)], 1)
    counter = mg.MarginalCounter(dom)
    acc = counter.add(counter.create(), codes.astype(np.int64))
    plan = mg.MarginalsPlan(
        selection="aim", domain=dom, iterations=5, rho=0.5, event=AimEvent("marginals", 0.5, 3), max_model_size=None
    )
    rec = mg.measure_aim(counter, acc, plan, key_from_test_seed(1)).record
    out, err = capsys.readouterr()
    lines = progress_lines(err, "AIM rounds")
    assert out == "" and "\r" not in err and 1 <= len(lines) <= 10, err
    assert "100/100 %" in lines[-1] and lines[-1].endswith(f"round={rec['rounds_run']}")


def test_the_audit_counts_its_trials_on_stderr_and_keeps_stdout_json():
    p = run_cli(
        "audit", "--mode", "fixed", "--mixing-order", "2", "--epsilon", "4", "--trials", "500", "--json",
        env={progress.ENV: ""},
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["trials"] == 500 and "progress" not in p.stdout
    lines = [ln for ln in p.stderr.splitlines() if "progress: audit" in ln]
    assert "\r" not in p.stderr and 1 <= len(lines) <= 10, p.stderr
    assert "1,000/1,000 trials (100%)" in lines[-1] and " INFO dpcda.progress: " in lines[-1]


def test_a_marginals_release_counts_its_rows_against_the_models_total(capsys):
    """marginals sets its row count in its fit (the model's total): the rows' tracker takes that total, stated before
    the first chunk, and ends at it."""
    import dpcda
    from tests.test_tables import SCHEMA, make_table

    rel = dpcda.release(make_table(400, seed=2), epsilon=2.0, mechanism="marginals", schema=SCHEMA, seed=3,
                        marginals_bins=4, marginals_iters=20)  # fmt: skip
    lines = progress_lines(capsys.readouterr().err, "marginals rows")
    n = f"{rel.table.num_rows:,}"
    assert lines and f"{n}/{n} rows (100%)" in lines[-1], lines
