"""Safe to schedule: publishing never loses data, bad options and files stop the job before work, the launcher owns
its job, nothing private reaches a message. Each test names the reviewed defect it covers (issue: safe to schedule).
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from dpcda.pipeline.cli import EXIT_BAD_INPUT, EXIT_SIGINT, EXIT_SIGTERM, main
from dpcda.schemas.manifest import Manifest
from dpcda.storage import publish
from tests.conftest import BEAM_ARGS, ROOT, make_dataset, run_cli, valid_manifest, write_dataset

X, Y = make_dataset(n_per_class=10, num_classes=3, dim=4, seed=2)
BASE = ["--sigma-x", "0.5", "--seed", "1"]


def snapshot(d: Path) -> dict:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def one_line(stderr: str, *needles: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert lines and lines[-1].startswith("dpcda: "), stderr[-2000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    for needle in needles:
        assert needle in lines[-1], f"{needle!r} not in {lines[-1]!r}"
    return lines[-1]


def cli(capsys, *args) -> tuple[int, str]:
    code = main([str(a) for a in args])
    return code, capsys.readouterr().err


def leftovers(out: Path) -> list:
    return sorted(p.name for p in out.parent.glob(out.name + ".*") if not p.name.endswith(".dpcda-lock"))


# ---------------------------------------------------------------- 1, 2: overwrite and races never lose data


def test_overwrite_never_deletes_the_input_or_a_foreign_directory(tmp_path, capsys):
    data = tmp_path / "D"
    glob_ = write_dataset(data, X, Y)
    (data / "NOTES.txt").write_text("keep me")
    before = snapshot(data)
    code, err = cli(capsys, "release", "--input", glob_, "--output", data, "--overwrite", *BASE, *BEAM_ARGS)
    assert code == EXIT_BAD_INPUT
    one_line(err, "lies inside the output")
    assert snapshot(data) == before
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "NOTES.txt").write_text("keep me too")
    code, err = cli(capsys, "release", "--input", glob_, "--output", victim, "--overwrite", *BASE, *BEAM_ARGS)
    assert code == EXIT_BAD_INPUT
    one_line(err, "not a release of ours")
    assert (victim / "NOTES.txt").read_text() == "keep me too" and leftovers(victim) == []


@pytest.mark.parametrize("kind", ["file", "symlink"])
def test_overwrite_onto_a_file_or_symlink_is_refused_before_work(tmp_path, capsys, kind):
    glob_ = write_dataset(tmp_path / "in", X, Y)
    out = tmp_path / "out"
    if kind == "file":
        out.write_text("not a release")
    else:
        real = tmp_path / "real"
        real.mkdir()
        (real / "manifest.json").write_text(json.dumps(valid_manifest()))
        out.symlink_to(real)
    code, err = cli(capsys, "release", "--input", glob_, "--output", out, "--overwrite", *BASE, *BEAM_ARGS)
    assert code == EXIT_BAD_INPUT
    one_line(err, "is a file" if kind == "file" else "symbolic link")
    assert leftovers(out) == []
    assert out.read_text() == "not a release" if kind == "file" else out.is_symlink()


def test_a_second_run_stops_at_once_while_another_holds_the_output(tmp_path):
    glob_ = write_dataset(tmp_path / "in", X, Y)
    out = tmp_path / "out"
    fd = os.open(tmp_path / ".out.dpcda-lock", os.O_CREAT | os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a run in progress
    try:
        res = run_cli("release", "--input", glob_, "--output", out, *BASE, *BEAM_ARGS)
    finally:
        os.close(fd)
    assert res.returncode == EXIT_BAD_INPUT
    one_line(res.stderr, "another release to this output is running")
    assert not out.exists() and leftovers(out) == []


def test_two_runs_racing_to_one_output_publish_once(tmp_path):
    """Started together: exactly one publishes; the other stops, and the release is the winner's."""
    glob_ = write_dataset(tmp_path / "in", *make_dataset(n_per_class=200, num_classes=3, dim=8))
    out = tmp_path / "out"
    env = {**os.environ}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dpcda.pipeline.cli",
                "release",
                "--input",
                glob_,
                "--output",
                str(out),
                "--sigma-x",
                "0.5",
                "--mixing-order",
                str(l),
                *BEAM_ARGS,
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for l in (2, 3)
    ]
    results = [p.communicate(timeout=300) + (p.returncode,) for p in procs]
    codes = sorted(r[2] for r in results)
    assert codes == [0, EXIT_BAD_INPUT], [r[1][-500:] for r in results]
    winner = 2 if results[0][2] == 0 else 3
    loser_err = results[1][1] if results[0][2] == 0 else results[0][1]
    one_line(loser_err, "another release to this output is running")
    assert json.loads((out / "manifest.json").read_text())["mechanism"]["mixing_order"] == winner
    assert leftovers(out) == []


def _typed(manifest: dict) -> Manifest:
    """A test manifest as publish takes it: the typed model the launcher assembles."""
    return Manifest.model_validate(manifest)


def _fake_run_dir(target: publish.Target) -> dict:
    manifest = valid_manifest()
    part = Path(target.workdir) / manifest["output"]["files"][0]["path"]
    part.parent.mkdir(parents=True)
    part.write_bytes(b"rows")
    manifest["output"]["files"][0]["bytes"] = 4
    return manifest


def test_an_output_that_appears_during_the_run_is_not_replaced(tmp_path):
    out = tmp_path / "out"
    target = publish.prepare(str(out), overwrite=False, inputs=[])
    manifest = _fake_run_dir(target)
    out.mkdir()  # someone else's directory, created while the job ran
    (out / "theirs.txt").write_text("theirs")
    with pytest.raises(publish.PublishError, match="a folder that is not a release of ours"):
        publish.publish(target, _typed(manifest))
    publish.abandon(target)
    assert snapshot(out) == {"theirs.txt": b"theirs"} and leftovers(out) == []


@pytest.mark.parametrize("exchange", [True, False])
def test_publish_replaces_a_release_whole_and_a_reader_never_sees_a_gap(tmp_path, monkeypatch, exchange):
    """With renameat2 (RENAME_EXCHANGE) a reader polling OUTPUT always finds a complete manifest; the fallback
    (two renames) is also correct, with a moment where OUTPUT is absent."""
    if not exchange:
        monkeypatch.setattr(publish, "_renameat2", lambda *a: False)
    out = tmp_path / "out"
    first = publish.prepare(str(out), overwrite=False, inputs=[])
    publish.publish(first, _typed(_fake_run_dir(first)))
    seen, stop = [], threading.Event()

    def reader():
        while not stop.is_set():
            try:
                seen.append(json.loads((out / "manifest.json").read_text())["output"]["rows"])
            except (FileNotFoundError, NotADirectoryError):
                seen.append(None)

    t = threading.Thread(target=reader)
    t.start()
    try:
        for i in range(20):
            target = publish.prepare(str(out), overwrite=True, inputs=[])
            manifest = _fake_run_dir(target)
            manifest["output"]["rows"] = 100 + i
            publish.publish(target, _typed(manifest))
    finally:
        stop.set()
        t.join()
    assert json.loads((out / "manifest.json").read_text())["output"]["rows"] == 119
    assert leftovers(out) == []
    if exchange:
        assert None not in seen and len(seen) > 20


def test_stale_run_directories_of_dead_runs_are_removed_and_look_alikes_are_not(tmp_path, capsys):
    """Only OUT.tmp-<run id> / OUT.old-<run id> carrying our run marker are swept (review: a backup named
    out.old-2025-backup and an input folder out.old-inputs were deleted)."""
    out = tmp_path / "out"
    inputs = tmp_path / "out.old-inputs"
    glob_ = write_dataset(inputs, X, Y)
    backup = tmp_path / "out.old-2025-backup"
    backup.mkdir()
    (backup / "keep.txt").write_text("keep")
    unmarked = tmp_path / "out.tmp-20250101T000000Z-0badc0de"  # our name, but no marker: not ours
    unmarked.mkdir()
    stale = tmp_path / "out.tmp-20250101T000000Z-deadbeef"
    (stale / "synthetic").mkdir(parents=True)
    (stale / publish.RUN_MARKER).write_text("x")
    code, err = cli(capsys, "release", "--input", glob_, "--output", out, *BASE, *BEAM_ARGS)
    assert code == 0, err[-2000:]
    assert not stale.exists() and unmarked.exists() and (backup / "keep.txt").exists()
    assert len(list(inputs.glob("*.parquet"))) == 2 and (out / "manifest.json").exists()


def test_a_run_that_died_mid_swap_is_repaired_by_the_next(tmp_path, monkeypatch):
    """Without renameat2 the old release is renamed aside first; if the run dies there, OUTPUT is absent. The next
    run puts the old release back before anything else."""
    monkeypatch.setattr(publish, "_renameat2", lambda *a: False)
    out = tmp_path / "out"
    first = publish.prepare(str(out), overwrite=False, inputs=[])
    publish.publish(first, _typed(_fake_run_dir(first)))
    before = snapshot(out)
    second = publish.prepare(str(out), overwrite=True, inputs=[])
    _fake_run_dir(second)
    original = os.rename

    def die_after_aside(src, dst):
        original(src, dst)
        if ".old-" in str(dst):
            raise SystemExit("killed")  # the process dies between the two renames

    monkeypatch.setattr(os, "rename", die_after_aside)
    with pytest.raises(SystemExit):
        publish.publish(
            second,
            _typed(
                {
                    **valid_manifest(),
                    "output": {
                        **valid_manifest()["output"],
                        "files": [
                            {"path": "synthetic/part-00000-of-00001.parquet", "rows": 4, "sha256": "0", "bytes": 4}
                        ],
                    },
                }
            ),
        )
    monkeypatch.setattr(os, "rename", original)
    os.close(second.lock_fd)  # the dead process's lock
    assert not out.exists()
    third = publish.prepare(str(out), overwrite=True, inputs=[])
    assert snapshot(out) == before  # the old release is back
    publish.abandon(third)
    assert leftovers(out) == []


def test_config_and_statistics_files_inside_the_output_are_protected(tmp_path, capsys):
    glob_ = write_dataset(tmp_path / "in", X, Y)
    out = tmp_path / "out"
    assert cli(capsys, "release", "--input", glob_, "--output", out, *BASE, *BEAM_ARGS)[0] == 0
    (out / "job.yaml").write_text("mixing_order: 2\n")
    code, err = cli(
        capsys,
        "release",
        "--input",
        glob_,
        "--output",
        out,
        "--config",
        out / "job.yaml",
        "--overwrite",
        *BASE,
        *BEAM_ARGS,
    )
    assert code == EXIT_BAD_INPUT
    one_line(err, "lies inside the output")
    assert (out / "job.yaml").exists()


def test_an_interrupt_after_the_switch_says_the_release_was_published(tmp_path, monkeypatch, capsys):
    """Review: an interrupt while the old release was being removed reported 'nothing was published'."""
    glob_ = write_dataset(tmp_path / "in", X, Y)
    out = tmp_path / "out"
    assert cli(capsys, "release", "--input", glob_, "--output", out, *BASE, *BEAM_ARGS)[0] == 0
    old = json.loads((out / "manifest.json").read_text())["created_at"]

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(publish, "_fsync_dir", interrupted)  # the last clean-up step after the switch
    code, err = cli(
        capsys,
        "release",
        "--input",
        glob_,
        "--output",
        out,
        "--overwrite",
        "--seed",
        "2",
        "--sigma-x",
        "0.5",
        *BEAM_ARGS,
    )
    monkeypatch.undo()
    assert code == EXIT_SIGINT
    one_line(err, "the release WAS published")
    assert (out / "manifest.json").exists()
    assert json.loads((out / "manifest.json").read_text())["input"]  # a complete release of ours
    del old


# ---------------------------------------------------------------- 3, 5, 6: refused before work


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--mixing-ordr", "16"], "unknown option --mixing-ordr; did you mean --mixing-order?"),
        (["--detla", "1e-9"], "unknown option --detla; did you mean --delta?"),
        (["--samples", str(101 * 30)], "more than 100 times the input's rows"),
        (["--sigma-y", "inf"], "sigma_y"),
        (["--seed", str(2**128)], "seed"),
        (["--num-classes", str(2**62)], "num_classes"),
        (["--mixing-order", str(10**9)], "mixing_order"),
        (["--runner=BogusRunner"], "--runner=BogusRunner: Unexpected pipeline runner"),
        (["--feature-bounds=0,1e160"], "too wide"),
        (["--no_wait_until_finish"], "--no_wait_until_finish"),
        (["--experiments=enable_data_sampling"], "pass --allow-exception-sampling"),
        (["--num_workers=abc"], "Beam option: argument --num_workers: invalid int value"),
        (["--max-class-bytes", "1e400G"], "expected bytes"),
        (["--output-shards", str(10**20)], "output_shards"),
        (["--mode", "poisson", "--num-classes", "3", "--epsilon", "0.001", "--sigma-x", "0"], "sigma_x"),
    ],
)
def test_bad_options_end_in_one_line_and_nothing_published(tmp_path, capsys, args, needle):
    glob_ = write_dataset(tmp_path / "in", X, Y)
    out = tmp_path / "out"
    beam = [] if any(a.startswith("--runner") for a in args) else BEAM_ARGS
    code, err = cli(capsys, "release", "--input", glob_, "--output", out, *BASE, *args, *beam)
    assert code == EXIT_BAD_INPUT, err[-2000:]
    one_line(err, needle)
    assert not out.exists() and leftovers(out) == []


def test_poisson_with_an_unreachable_histogram_share_ends_in_one_line(tmp_path, capsys):
    glob_ = write_dataset(tmp_path / "in", X, Y)
    code, err = cli(
        capsys,
        "release",
        "--input",
        glob_,
        "--output",
        tmp_path / "out",
        "--mode",
        "poisson",
        "--num-classes",
        "3",
        "--epsilon",
        "0.01",
        "--seed",
        "1",
        *BEAM_ARGS,
    )
    assert code == EXIT_BAD_INPUT, err[-2000:]
    one_line(err, "cannot be reached")


def test_sigma_x_inf_and_bad_outputs_are_refused(tmp_path, capsys):
    glob_ = write_dataset(tmp_path / "in", X, Y)
    (tmp_path / "afile").write_text("x")
    for output, extra, needle in [
        (tmp_path / "out", ["--sigma-x", "inf"], "sigma_x"),
        ("", BASE, "not a release directory"),
        ("/", BASE, "not a release directory"),
        (tmp_path / "afile" / "rel", BASE, "is not a directory"),
    ]:
        code, err = cli(capsys, "release", "--input", glob_, "--output", output, *extra, *BEAM_ARGS)
        assert code == EXIT_BAD_INPUT, err[-2000:]
        one_line(err, needle)
    assert (tmp_path / "afile").read_text() == "x"


@pytest.mark.parametrize(
    "content,needle",
    [
        ("mixing_order: [4\n", "not valid YAML (line"),
        ("1: 2\n", "mapping of field names"),
        (b"\xff\xfe\x00binary", "not a text file"),
        ("!!python/object:os.system {}\n", "not valid YAML"),
        ("mixing_order: true\n", "expected an integer, got a boolean"),
        (None, "is not a file"),
    ],
)
def test_config_file_problems_end_in_one_line(tmp_path, capsys, content, needle):
    glob_ = write_dataset(tmp_path / "in", X, Y)
    cfg = tmp_path / "cfg.yaml"
    if content is None:
        cfg.mkdir()
    elif isinstance(content, bytes):
        cfg.write_bytes(content)
    else:
        cfg.write_text(content)
    code, err = cli(
        capsys, "release", "--input", glob_, "--output", tmp_path / "out", "--config", cfg, *BASE, *BEAM_ARGS
    )
    assert code == EXIT_BAD_INPUT
    one_line(err, needle)


@pytest.mark.parametrize(
    "content,needle",
    [
        (None, "cannot be read"),
        ('{"mean": [0.5, 0.5, 0.5, 0.5], "std": ', "not valid JSON"),
        ('{"mean": ["a", "b", "c", "d"], "std": [1, 1, 1, 1]}', "'mean' must be a list of numbers"),
        ("[1, 2]", "must hold an object"),
        ('{"mean": [[0.5, 0.5], [0.5, 0.5]], "std": [1, 1, 1, 1]}', "flat list of 4 numbers, found shape [2, 2]"),
        ('{"mean": [0.5, 0.5, 0.5, 0.5], "std": [1e-45, 1, 1, 1]}', "below 1e-12"),
    ],
)
def test_normalization_file_problems_are_found_before_the_pipeline(tmp_path, capsys, content, needle):
    glob_ = write_dataset(tmp_path / "in", X, Y)
    stats = tmp_path / "stats.json"
    if content is not None:
        stats.write_text(content)
    code, err = cli(
        capsys,
        "release",
        "--input",
        glob_,
        "--output",
        tmp_path / "out",
        "--normalization",
        "public",
        "--normalization-file",
        stats,
        *BASE,
        *BEAM_ARGS,
    )
    assert code == EXIT_BAD_INPUT, err[-2000:]
    one_line(err, needle)
    assert not (tmp_path / "out").exists()


def test_zero_width_features_duplicate_columns_and_fifos_are_refused(tmp_path, capsys):
    empty = tmp_path / "w0"
    empty.mkdir()
    pq.write_table(
        pa.table({"features": pa.array([[]] * 3, pa.list_(pa.float32())), "label": pa.array([0, 1, 2])}),
        empty / "a.parquet",
    )
    code, err = cli(capsys, "release", "--input", empty / "*.parquet", "--output", tmp_path / "o1", *BASE, *BEAM_ARGS)
    assert code == EXIT_BAD_INPUT
    one_line(err, "width 0")
    dup = tmp_path / "dup"
    dup.mkdir()
    flat = pa.FixedSizeListArray.from_arrays(pa.array(X.reshape(-1)), 4)
    pq.write_table(
        pa.Table.from_arrays([flat, flat, pa.array(Y)], names=["features", "features", "label"]), dup / "a.parquet"
    )
    code, err = cli(capsys, "release", "--input", dup / "*.parquet", "--output", tmp_path / "o2", *BASE, *BEAM_ARGS)
    assert code == EXIT_BAD_INPUT
    one_line(err, "column 'features' appears 2 times")
    fifo_dir = tmp_path / "fifo"
    write_dataset(fifo_dir, X, Y)
    os.mkfifo(fifo_dir / "part-zzz.parquet")
    code, err = cli(
        capsys, "release", "--input", fifo_dir / "*.parquet", "--output", tmp_path / "o3", *BASE, *BEAM_ARGS
    )
    assert code == EXIT_BAD_INPUT
    one_line(err, "not a regular file")


def test_eval_input_of_the_wrong_width_is_refused_before_work(tmp_path, capsys):
    glob_ = write_dataset(tmp_path / "in", X, Y)
    test_glob = write_dataset(tmp_path / "test", np.zeros((6, 5), np.float32), np.arange(6) % 3)
    code, err = cli(
        capsys, "release", "--input", glob_, "--output", tmp_path / "out", "--eval-input", test_glob, *BASE, *BEAM_ARGS
    )
    assert code == EXIT_BAD_INPUT
    one_line(err, "test rows have width 5, the input has 4")
    assert not (tmp_path / "out").exists()


def test_non_finite_statistics_or_rows_are_never_published():
    from dpcda.mechanisms.plan import PlanError, check_statistics
    from dpcda.transforms.mix import _MixFn

    with pytest.raises(PlanError, match="not finite"):
        check_statistics(np.array([np.nan, 0.0]), np.ones(2), (0.0, 1.0), 1.0)
    with pytest.raises(PlanError, match="below 1e-12"):
        check_statistics(np.zeros(2), np.array([1e-45, 1.0]), (0.0, 1.0), 1.0)

    class Mix:  # the mechanism's own plan (mechanisms.dpcda.DpcdaPlan)
        mixing_order, samples_per_class, sampling_rates = 1, (3,), [1]
        sigma_x, sigma_y, lowpass, denoise_spec = 0.0, 0.0, None, None

    class Plan:  # rows that are not finite (here: no noise on infinite records) are refused, not written
        num_classes, mode, synthesis = 1, "fixed", Mix

    fn = _MixFn("cpu", 16, "features", "label")
    fn.setup()
    with pytest.raises(PlanError, match="not finite"):
        list(fn.process((0, np.full((2, 2), np.inf)), Plan(), b"k" * 32))
    from dpcda.privacy.noise import NoiseStream

    with pytest.raises(ArithmeticError, match="overflow"):
        NoiseStream(b"k" * 32, "x").gaussian(np.full(3, 1e308), 1e308)


# ---------------------------------------------------------------- signals


def _slow_input(tmp_path) -> str:
    x, y = make_dataset(n_per_class=4000, num_classes=3, dim=64, seed=1)
    return write_dataset(tmp_path / "big", x, y, shards=4)


@pytest.mark.parametrize(
    "sig,code,words",
    [(signal.SIGTERM, EXIT_SIGTERM, "terminated (SIGTERM)"), (signal.SIGINT, EXIT_SIGINT, "interrupted")],
)
def test_a_signal_cleans_up_and_ends_in_one_line(tmp_path, sig, code, words):
    glob_ = _slow_input(tmp_path)
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dpcda.pipeline.cli",
            "release",
            "--input",
            glob_,
            "--output",
            str(out),
            "--epsilon",
            "5",
            "--samples",
            "600000",
            *BEAM_ARGS,
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 120
    while time.time() < deadline and not list(tmp_path.glob("out.tmp-*")):
        time.sleep(0.1)
    time.sleep(2.0)  # inside the pipeline
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err[-3000:]
    assert one_line(err).startswith(f"dpcda: {words}")
    assert not out.exists() and leftovers(out) == []


@pytest.mark.parametrize("published", [True, False], ids=["after-publishing", "before-publishing"])
def test_an_interrupt_after_the_release_is_published_says_it_is_complete(tmp_path, capsys, monkeypatch, published):
    """The window between publishing and the command's end (its log line, the summary): an interrupt there must not
    say "nothing was published" (a user would release again and spend the budget twice)."""
    import dpcda.pipeline.release as rel

    glob_ = write_dataset(tmp_path / "in", X, Y, shards=1)
    out = tmp_path / "out"

    def run_release(cfg, beam_args, stages=(), *, on_published=None, **kwargs):
        if published:
            on_published()
        os.kill(os.getpid(), signal.SIGINT)  # the CLI's handler raises here, in this (the main) thread
        time.sleep(5)
        raise AssertionError("the interrupt did not arrive")

    monkeypatch.setattr(rel, "run_release", run_release)
    code, err = cli(capsys, "release", "--input", glob_, "--output", out, "--epsilon", "5", *BEAM_ARGS)
    assert code == EXIT_SIGINT
    if published:
        one_line(err, "interrupted", f"the release at {out} WAS published and is complete")
    else:
        one_line(err, "interrupted", "nothing was published")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored: main ran in this process


def _ledger_args(tmp_path) -> list:
    from dpcda.storage.ledger import open_ledger

    open_ledger(str(tmp_path / "ledger.db"), create=True)
    return ["--epsilon", "5", "--ledger", tmp_path / "ledger.db", "--dataset-id", "ds"]  # unseeded: a private release


@pytest.mark.parametrize("ledger", [False, True], ids=["no-ledger", "ledger"])
def test_the_release_says_published_once_its_manifest_is_in_place(tmp_path, capsys, monkeypatch, ledger):
    import dpcda.pipeline.cli.base as base

    seen = []
    out = tmp_path / "out"
    monkeypatch.setattr(base, "published", lambda what: seen.append((what, (out / "manifest.json").is_file())))
    glob_ = write_dataset(tmp_path / "in", X, Y, shards=1)
    args = _ledger_args(tmp_path) if ledger else BASE
    code, err = cli(capsys, "release", "--input", glob_, "--output", out, *args, *BEAM_ARGS)
    assert code == 0, err[-2000:]
    assert seen == [(f"the release at {out}", True)]


def test_an_interrupt_while_the_ledger_records_says_published_and_how_to_resolve(tmp_path, capsys, monkeypatch):
    import dpcda.pipeline.release_ledger as rel
    from dpcda.storage.ledger import open_ledger

    def record(*args):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
        raise AssertionError("the interrupt did not arrive")

    monkeypatch.setattr(rel, "_record", record)
    out = tmp_path / "out"
    glob_ = write_dataset(tmp_path / "in", X, Y, shards=1)
    code, err = cli(capsys, "release", "--input", glob_, "--output", out, *_ledger_args(tmp_path), *BEAM_ARGS)
    assert code == EXIT_SIGINT
    line = one_line(err, f"the release at {out} WAS published and is complete", "has not recorded it", "ledger resolve")
    (entry,) = [e for e in open_ledger(str(tmp_path / "ledger.db")).entries("ds") if e["state"] != "cap"]
    assert entry["state"] == "pending" and entry["run"] in line  # it keeps counting; the line names the run
    assert (out / "manifest.json").is_file()


# ---------------------------------------------------------------- 7: GCS publish


def _gcs_objects(prefix: str) -> dict:
    bucket, name = publish.split_gs(prefix)
    return {b.name: b for b in publish.gcs_client().bucket(bucket).list_blobs(prefix=name + "/")}


@pytest.mark.gcs
def test_gcs_release_lives_under_its_run_prefix_and_the_old_one_goes_after_the_switch(gcs):
    from dpcda.pipeline.release import run_release
    from dpcda.schemas.config import load_config
    from dpcda.storage.shards import write_parquet

    write_parquet(f"{gcs}/in/a.parquet", X, Y)
    cfg = load_config(None, {"input": f"{gcs}/in/*.parquet", "output": f"{gcs}/rel", "sigma_x": 0.5, "seed": 1})
    first = run_release(cfg, BEAM_ARGS).model_dump(mode="json")
    assert first["output"]["prefix"].startswith("runs/")
    assert all(f["path"].startswith(first["output"]["prefix"]) for f in first["output"]["files"])
    second = run_release(cfg.model_copy(update={"overwrite": True}), BEAM_ARGS).model_dump(mode="json")
    names = set(_gcs_objects(f"{gcs}/rel"))
    assert f"rel/{second['output']['files'][0]['path']}" in names
    assert not any(n.startswith(f"rel/{first['output']['prefix']}") for n in names)  # old run removed
    assert not any(n.endswith(publish.DRAFT) for n in names)


@pytest.mark.gcs
def test_gcs_missing_part_publishes_nothing_and_the_old_release_stays(gcs):
    out = f"{gcs}/rel"
    old = publish.prepare(out, overwrite=False, inputs=[])
    bucket = publish.gcs_client().bucket("lake")
    old_manifest = valid_manifest()
    old_manifest["output"] = {
        "rows": 4,
        "prefix": old.prefix,
        "files": [{"path": f"{old.prefix}synthetic/p.parquet", "rows": 4, "sha256": "0", "bytes": 4}],
    }
    bucket.blob(f"rel/{old.prefix}synthetic/p.parquet").upload_from_string(b"rows")
    publish.publish(old, _typed(old_manifest))
    before = bucket.get_blob("rel/manifest.json").download_as_bytes()
    new = publish.prepare(out, overwrite=True, inputs=[])
    manifest = {
        **old_manifest,
        "output": {
            "rows": 8,
            "prefix": new.prefix,
            "files": [
                {"path": f"{new.prefix}synthetic/p0.parquet", "rows": 4, "sha256": "0", "bytes": 4},
                {"path": f"{new.prefix}synthetic/p1.parquet", "rows": 4, "sha256": "0", "bytes": 4},
            ],
        },
    }
    bucket.blob(f"rel/{new.prefix}synthetic/p0.parquet").upload_from_string(b"rows")  # p1 failed to upload
    with pytest.raises(publish.PublishError, match="p1.parquet: part missing"):
        publish.publish(new, _typed(manifest))
    publish.abandon(new)
    assert bucket.get_blob("rel/manifest.json").download_as_bytes() == before
    assert bucket.get_blob(f"rel/{old.prefix}synthetic/p.parquet") is not None
    assert not any(n.startswith(f"rel/{new.prefix}") for n in _gcs_objects(out))


@pytest.mark.gcs
def test_gcs_two_publishers_cannot_both_win(gcs):
    out = f"{gcs}/rel"
    bucket = publish.gcs_client().bucket("lake")
    a = publish.prepare(out, overwrite=False, inputs=[])
    b = publish.prepare(out, overwrite=False, inputs=[])  # both saw no manifest
    for t in (a, b):
        bucket.blob(f"rel/{t.prefix}synthetic/p.parquet").upload_from_string(b"rows")

    def manifest(t, rows):
        m = valid_manifest()
        m["output"] = {
            "rows": rows,
            "prefix": t.prefix,
            "files": [{"path": f"{t.prefix}synthetic/p.parquet", "rows": rows, "sha256": "0", "bytes": 4}],
        }
        return m

    publish.publish(a, _typed(manifest(a, 1)))
    with pytest.raises(publish.PublishError, match="another release was published there"):
        publish.publish(b, _typed(manifest(b, 2)))
    publish.abandon(b)
    assert json.loads(bucket.get_blob("rel/manifest.json").download_as_bytes())["output"]["rows"] == 1


@pytest.mark.gcs
def test_gcs_an_interrupt_after_the_switch_keeps_the_new_release(gcs, monkeypatch):
    """Review: an interrupt while the old run was being deleted made abandon() delete the NEW run's parts."""
    out = f"{gcs}/rel"
    bucket = publish.gcs_client().bucket("lake")

    def release(rows):
        t = publish.prepare(out, overwrite=True, inputs=[])
        bucket.blob(f"rel/{t.prefix}synthetic/p.parquet").upload_from_string(b"rows")
        m = valid_manifest()
        m["output"] = {
            "rows": rows,
            "prefix": t.prefix,
            "files": [{"path": f"{t.prefix}synthetic/p.parquet", "rows": rows, "sha256": "0", "bytes": 4}],
        }
        return t, m

    first, m1 = release(1)
    publish.publish(first, _typed(m1))
    second, m2 = release(2)
    monkeypatch.setattr(publish, "_delete_gcs_prefix", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        publish.publish(second, _typed(m2))
    assert second.published
    publish.abandon(second)  # what run_release does on the way out
    assert json.loads(bucket.get_blob("rel/manifest.json").download_as_bytes())["output"]["rows"] == 2
    assert bucket.get_blob(f"rel/{second.prefix}synthetic/p.parquet") is not None


@pytest.mark.gcs
def test_gcs_refuses_foreign_objects_and_removes_stale_runs(gcs):
    bucket = publish.gcs_client().bucket("lake")
    bucket.blob("data/table.csv").upload_from_string(b"a,b")
    with pytest.raises(publish.PublishError, match="holds objects but no release"):
        publish.prepare(f"{gcs}/data", overwrite=True, inputs=[])
    bucket.blob("rel/runs/20200101T000000Z-deadbeef/synthetic/p.parquet").upload_from_string(b"old")
    bucket.blob("rel/runs/29990101T000000Z-livelive/synthetic/p.parquet").upload_from_string(b"live")
    target = publish.prepare(f"{gcs}/rel", overwrite=False, inputs=[])
    names = set(_gcs_objects(f"{gcs}/rel"))
    assert "rel/runs/20200101T000000Z-deadbeef/synthetic/p.parquet" not in names  # a dead run, 72 h and older
    assert "rel/runs/29990101T000000Z-livelive/synthetic/p.parquet" in names  # a recent run may be alive
    publish.abandon(target)


# ---------------------------------------------------------------- 8, 9: the launcher


class _FakeResult:
    def __init__(self, error=None, state="DONE"):
        self.error, self.state, self.cancelled = error, state, False

    def job_id(self):
        return "2026-11-23_01_02_03-123"

    def wait_until_finish(self):
        if self.error:
            raise self.error
        return self.state

    def cancel(self):
        self.cancelled = True


class _FakePipeline:
    def __init__(self, result):
        self.result = result

    def run(self):
        return self.result


DATAFLOW = [
    "--runner=DataflowRunner",
    "--project=p",
    "--region=europe-west4",
    "--temp_location=gs://b/tmp",
    "--staging_location=gs://b/staging",
]


def test_launcher_logs_the_job_and_cancels_it_when_interrupted(caplog):
    from dpcda.pipeline.release import run_pipeline

    options = PipelineOptions(DATAFLOW)
    info, _ = run_pipeline(_FakePipeline(_FakeResult()), options)
    assert info.job_id == "2026-11-23_01_02_03-123"
    assert info.console_url == (
        "https://console.cloud.google.com/dataflow/jobs/europe-west4/2026-11-23_01_02_03-123?project=p"
    )
    result = _FakeResult(error=KeyboardInterrupt())
    with caplog.at_level("INFO"), pytest.raises(KeyboardInterrupt):
        run_pipeline(_FakePipeline(result), options)
    assert result.cancelled and "job_id=2026-11-23_01_02_03-123" in caplog.text


def test_launcher_refuses_a_failed_job_and_options_it_cannot_honour():
    from dpcda.pipeline import __version__, build_commit
    from dpcda.pipeline.release import ReleaseError, check_launcher_options, run_pipeline

    with pytest.raises(ReleaseError, match="ended in state FAILED"):
        run_pipeline(_FakePipeline(_FakeResult(state="FAILED")), PipelineOptions(DATAFLOW))
    good = f"--sdk_container_image=europe-docker.pkg.dev/p/dpcda/worker:{__version__}-{build_commit()}"
    check_launcher_options(PipelineOptions([*DATAFLOW, good]))
    check_launcher_options(PipelineOptions([*DATAFLOW, good + "@sha256:" + "0" * 64]))  # a digest pin keeps its tag
    for extra, needle in [
        ([], "pass --sdk_container_image"),
        ([good, "--setup_file=./setup.py"], "reinstall"),
        (["--sdk_container_image=x/worker:0.0.1"], "does not match this launcher"),
    ]:
        with pytest.raises(ReleaseError, match=needle):
            check_launcher_options(PipelineOptions([*DATAFLOW, *extra]))


def test_dataflow_with_local_paths_is_refused_before_work(tmp_path):
    from dpcda.pipeline import __version__, build_commit
    from dpcda.pipeline.release import ReleaseError, run_release
    from dpcda.schemas.config import load_config

    glob_ = write_dataset(tmp_path / "in", X, Y)
    cfg = load_config(None, {"input": glob_, "output": str(tmp_path / "out"), "sigma_x": 0.5})
    image = f"--sdk_container_image=x/worker:{__version__}-{build_commit()}"
    with pytest.raises(ReleaseError, match="cannot reach local paths"):
        run_release(cfg, [*DATAFLOW, image])
    assert not (tmp_path / "out").exists()


def test_worker_refuses_code_of_another_build():
    from dpcda.pipeline import __version__, build_commit
    from dpcda.storage.build import check_build

    check_build((__version__, build_commit()))
    with pytest.raises(RuntimeError, match="does not match the launcher"):
        check_build((__version__, "0000000"))


def test_noise_threads_reach_the_workers(monkeypatch):
    """--noise-threads travels with the build every DoFn checks in its setup (a Dataflow worker is another process,
    which the launcher's own set_threads never reaches); without it a worker uses its own cores."""
    from dpcda.pipeline import __version__, build_commit
    from dpcda.privacy import noise
    from dpcda.privacy.noise import pool
    from dpcda.storage.build import WorkerBuild
    from dpcda.transforms.mix import _MixFn

    monkeypatch.setattr(pool, "_THREADS", None)  # restored after the test
    fn = _MixFn("cpu", 64, "features", "label", expected_build=WorkerBuild(__version__, build_commit(), 3))
    fn.setup()
    assert noise.threads() == 3
    noise.set_threads(None)
    _MixFn("cpu", 64, "features", "label", expected_build=WorkerBuild(__version__, build_commit())).setup()
    assert noise.threads() == noise.available_cores()
    # the join path's index requests, and the stages written as beam.Map (the plan, DP-PCA, table decoding)
    from dpcda.storage.build import checked
    from dpcda.transforms.join import _RequestsFn

    _RequestsFn(64, WorkerBuild(__version__, build_commit(), 2)).setup()
    assert noise.threads() == 2
    step = checked(lambda x: x + 1, WorkerBuild(__version__, build_commit(), 5))
    assert step(1) == 2 and noise.threads() == 5
    with pytest.raises(RuntimeError, match="does not match the launcher"):
        checked(lambda x: x, WorkerBuild(__version__, "0000000"))(1)
    noise.set_threads(None)


def test_cli_turns_off_exception_sampling_unless_allowed(tmp_path, monkeypatch):
    import dpcda.pipeline.release as release_mod

    seen = []
    monkeypatch.setattr(
        release_mod,
        "run_release",
        lambda cfg, beam_args, *a, **k: seen.append(beam_args) or _typed(valid_manifest()),
    )
    for extra in ([], ["--allow-exception-sampling"]):
        assert main(["release", "--input", "x", "--output", str(tmp_path / "o"), *BASE, *extra]) == 0
    assert "--experiments=disable_always_on_exception_sampling" in seen[0]
    assert not any("exception_sampling" in a for a in seen[1])


# ---------------------------------------------------------------- 11: one copy of a class


def test_a_class_is_held_once_while_it_is_normalised_and_mixed():
    """numpy's allocations (tracemalloc) while one class of 20,000 x 64 goes through NormalizeAndClip and the mixer:
    the float64 class array once, plus chunk-sized buffers; the old path held about four copies."""
    from fractions import Fraction
    from types import SimpleNamespace

    from dpcda.mechanisms.dpcda import mix_class
    from dpcda.privacy.noise import key_from_test_seed
    from dpcda.transforms.normalize import _normalize

    rng = np.random.default_rng(0)
    parts = [rng.uniform(0, 1, (5000, 64)).astype(np.float32) for _ in range(4)]
    plan = SimpleNamespace(
        class_rows=[20000], feature_dim=64, mean=np.full(64, 0.5), std=np.full(64, 0.3), clip=1.0, bounds=(0.0, 1.0)
    )
    class_bytes = 20000 * 64 * 8
    tracemalloc.start()
    try:
        _, x = _normalize((0, iter(parts)), plan)
        for _ in mix_class(
            x,
            key=key_from_test_seed(0),
            class_index=0,
            num_classes=1,
            mode="fixed",
            mixing_order=4,
            sigma_x=0.1,
            samples=20000,
            chunk_rows=2048,
            sampling_rate=Fraction(4, 20000),
        ):
            pass
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1.6 * class_bytes, peak / class_bytes


def test_parquet_readers_do_not_read_ahead(tmp_path, monkeypatch):
    """pyarrow's pre-buffering reads ahead on its IO threads through our Python file objects; a reader given up early
    (the width peek, a bad row) left such reads running, and one ending while the interpreter exited aborted the CLI
    (SIGABRT instead of exit status 2, about one run in 25 of a one-line-error test). Every reader is opened without."""
    from dpcda.storage.shards import read_shard
    from dpcda.storage.tables import arrow_schema_of

    seen = []
    real = pq.ParquetFile

    def recording(*args, **kwargs):
        seen.append(kwargs.get("pre_buffer", True))  # pyarrow's default is True
        return real(*args, **kwargs)

    monkeypatch.setattr(pq, "ParquetFile", recording)
    write_dataset(tmp_path / "in", X, Y, shards=1)
    (path,) = map(str, (tmp_path / "in").glob("*.parquet"))
    assert next(iter(read_shard(path, "parquet", "features", "label", batch_rows=1))).features.shape[1] == X.shape[1]
    arrow_schema_of(path)
    assert len(seen) == 2 and not any(seen), seen


@pytest.mark.gcs
def test_gcs_stale_runs_are_swept_only_past_the_clock_skew_margin(gcs):
    """The 72 h sweep has a clock-skew margin: a sweeper whose clock runs up to CLOCK_SKEW_HOURS ahead of the run's
    launcher must not remove a run younger than STALE_RUN_HOURS by that launcher's clock; it sweeps past the sum."""
    import datetime

    bucket = publish.gcs_client().bucket("lake")
    now = datetime.datetime.now(datetime.timezone.utc)

    def run_aged(hours: float, tag: str) -> str:
        stamp = (now - datetime.timedelta(hours=hours)).strftime("%Y%m%dT%H%M%SZ")
        name = f"rel/runs/{stamp}-{tag}/synthetic/p.parquet"
        bucket.blob(name).upload_from_string(b"x")
        return name

    skew = publish.CLOCK_SKEW_HOURS
    young = run_aged(publish.STALE_RUN_HOURS - 1, "0000000a")
    skewed = run_aged(publish.STALE_RUN_HOURS + skew - 1, "0000000b")  # 72 h old to us, under 72 h to its launcher
    old = run_aged(publish.STALE_RUN_HOURS + skew + 1, "0000000c")
    target = publish.prepare(f"{gcs}/rel", overwrite=False, inputs=[])
    names = set(_gcs_objects(f"{gcs}/rel"))
    assert young in names and skewed in names and old not in names
    publish.abandon(target)


def test_a_probe_of_the_output_lock_does_not_refuse_a_run_that_takes_it(tmp_path):
    """``locks.held`` (ledger resolve's check) takes the lock for an instant; a run taking it then retries briefly
    rather than reporting another release."""
    import fcntl
    import threading

    from dpcda.storage import locks

    out = str(tmp_path / "rel")
    fd = locks.take(out)
    os.close(fd)  # an unlocked lock file stays, as a killed run leaves it
    probe = os.open(locks.lock_path(out), os.O_RDONLY)
    fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a probe holding it for a moment
    threading.Timer(0.1, lambda: (fcntl.flock(probe, fcntl.LOCK_UN), os.close(probe))).start()
    fd = locks.take(out)  # refused with BlockingIOError before the retries
    assert locks.held(out)  # flock is per open file: another open of it finds it held
    locks.unlock(type("Target", (), {"lock_fd": fd, "output": out})())
    assert not os.path.exists(locks.lock_path(out)) and not locks.held(out)
