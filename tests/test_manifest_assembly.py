"""The manifest is assembled once, typed: the draft read back and validated there, each declared stage's section checked
the moment it returns (a bad one fails at its own step, named, and nothing is published), one ``assemble`` whose JSON
is what the dict path wrote before."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pydantic
import pytest

from dpcda.pipeline.errors import ReleaseError
from dpcda.pipeline.manifest import Stage, assemble, read_draft, run_stages
from dpcda.schemas.config import load_config
from dpcda.schemas.manifest import Manifest, RunInfo
from dpcda.storage import publish
from tests.conftest import BEAM_ARGS, make_dataset, valid_manifest, write_dataset

RUN = RunInfo(runner="DirectRunner")
LEDGER = {"uri": "ledger.db", "dataset_id": "d", "run": "r", "before": {"epsilon": 0.0}}
# NaN and infinity were written as null by the dict path (pydantic's JSON mode): they still are
UTILITY = {"accuracy_mean": 0.75, "probe_accuracy": math.nan, "spread": math.inf, "runs": 1, "pair": (1, 2)}
CANARY = {"empirical_epsilon_lower_bound": 0.5, "violation": False, "scope": None}


def _draft_text() -> str:
    return Manifest.model_validate(valid_manifest()).write_json()


def test_the_assembled_manifest_is_what_the_dict_path_published():
    """The old launcher: json.loads the draft, set run, set each stage's section, set ledger, then
    ``Manifest(**dict).write_json()``. The typed path gives the same text."""
    text = _draft_text()
    old = json.loads(text)
    old["run"] = RUN.model_dump(mode="json")
    old["utility"] = UTILITY
    old["audit"] = CANARY
    old["ledger"] = LEDGER
    before = Manifest(**old).write_json()

    stages = (
        Stage("evaluation", "utility", lambda workdir, m: dict(UTILITY)),
        Stage("audit", "audit", lambda workdir, m: dict(CANARY)),
    )
    draft = read_draft(text, "run/manifest.draft.json")
    sections = run_stages(stages, "run", draft.model_copy(update={"run": RUN}))
    now = assemble(draft, RUN, sections, LEDGER)
    assert isinstance(now, Manifest) and now.write_json() == before
    assert json.loads(before)["utility"]["probe_accuracy"] is None
    assert assemble(draft, RUN, {}).write_json() == Manifest(**{**json.loads(text), "run": old["run"]}).write_json()


def test_a_draft_that_does_not_validate_is_refused_naming_the_draft():
    bad = valid_manifest()
    del bad["privacy"]["delta"]
    with pytest.raises(ReleaseError, match=r"OUT\.tmp-1/manifest\.draft\.json: the pipeline's manifest draft") as err:
        read_draft(json.dumps(bad), "OUT.tmp-1/manifest.draft.json")
    assert "privacy.delta" in str(err.value) and "nothing was published" in str(err.value)
    with pytest.raises(ReleaseError, match="draft does not validate"):
        read_draft("{not json", "d.json")


@pytest.mark.parametrize(
    "section, needle",
    [
        (["not", "a", "mapping"], "does not fit the manifest"),
        ({"runs": np.int64(3)}, "cannot be written as the manifest's JSON"),
        ({"scores": object()}, "cannot be written as the manifest's JSON"),
    ],
)
def test_a_stage_with_a_malformed_section_fails_at_its_own_step_named(section, needle):
    ran = []

    def later(workdir, manifest):
        ran.append("later")
        return {}

    stages = (
        Stage("audit", "audit", lambda workdir, m: dict(CANARY)),
        Stage("broken evaluation", "utility", lambda workdir, m: section),
        Stage("membership audit", "audit", later),
    )
    draft = read_draft(_draft_text(), "d.json")
    with pytest.raises(ReleaseError, match=f"stage broken evaluation: its 'utility' section {needle}"):
        run_stages(stages, "run", draft)
    assert ran == []  # the stages after it do not run


def test_numpy_values_in_a_section_are_refused_at_the_stage():
    """The published JSON cannot hold a numpy array: the stage that returned one is named, not the publish step."""
    draft = read_draft(_draft_text(), "d.json")
    stage = Stage("table evaluation", "utility", lambda workdir, m: {"fidelity": np.array([0.5, 0.25])})
    with pytest.raises(ReleaseError, match="stage table evaluation: its 'utility' section cannot be written"):
        run_stages((stage,), "run", draft)


def test_a_stage_reads_a_frozen_copy_and_the_sections_before_it():
    seen, returned = [], []

    def first(workdir, manifest):
        with pytest.raises(pydantic.ValidationError):
            manifest.audit = {"forged": True}  # frozen
        manifest.privacy.caveats.append("edited by a stage")  # a copy: the draft and later stages never see it
        returned.append({"canary": 1})
        return returned[-1]

    def second(workdir, manifest):
        seen.append((workdir, manifest.run, dict(manifest.audit), list(manifest.privacy.caveats)))
        manifest.audit["canary"] = 99  # again a copy: the first stage's section stays as it returned it
        return {**manifest.audit, "membership": 2}

    draft = read_draft(_draft_text(), "d.json")
    viewed = draft.model_copy(update={"run": RUN})
    sections = run_stages((Stage("audit", "audit", first), Stage("membership audit", "audit", second)), "W", viewed)
    assert seen == [("W", RUN, {"canary": 1}, [])]
    assert sections == {"audit": {"canary": 99, "membership": 2}}  # the later stage's section replaces the earlier
    assert returned == [{"canary": 1}] and draft.privacy.caveats == [] and draft.audit is None


def test_a_stage_must_name_a_section_stages_fill():
    with pytest.raises(ValueError, match="stage evaluation: 'evaluation' is not a stage's section"):
        Stage("evaluation", "evaluation", lambda workdir, m: {})
    with pytest.raises(ValueError, match="'privacy' is not a stage's section"):
        Stage("rewrite", "privacy", lambda workdir, m: {})
    draft = read_draft(_draft_text(), "d.json")
    with pytest.raises(ReleaseError, match="'privacy' is not a stage's section"):
        assemble(draft, RUN, {"privacy": {}})
    with pytest.raises(ReleaseError, match="the ledger: its 'ledger' section does not fit"):
        assemble(draft, RUN, {}, ["not", "a", "mapping"])


def test_publish_takes_the_typed_manifest_only(tmp_path):
    target = publish.prepare(str(tmp_path / "out"), overwrite=False, inputs=[])
    try:
        with pytest.raises(TypeError, match="takes the typed Manifest, not dict"):
            publish.publish(target, valid_manifest())
    finally:
        publish.abandon(target)
    assert not (tmp_path / "out").exists()


def test_release_stages_are_declared_in_order_with_their_sections(tmp_path):
    from dpcda.pipeline.release import release_stages

    common = {"input": "in/*.parquet", "output": str(tmp_path / "out"), "epsilon": 5.0}
    cfg = load_config(None, {**common, "eval_input": "test/*.parquet", "audit": True, "membership_audit": True})
    stages = release_stages(cfg)
    assert [(s.name, s.section) for s in stages] == [
        ("evaluation", "utility"),
        ("audit", "audit"),
        ("membership audit", "audit"),
    ]
    assert all(isinstance(s, Stage) for s in stages)
    with pytest.raises(AttributeError):
        stages[0].name = "other"  # frozen
    assert release_stages(load_config(None, common)) == ()


def _tree(d: Path) -> dict:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_a_release_whose_stage_returns_a_malformed_section_publishes_nothing(tmp_path):
    """The pipeline ran and wrote its parts; the stage's section does not fit: the error names the stage, the run
    directory is removed and OUTPUT (an earlier release, replaced only if the run succeeds) is left as it was."""
    from dpcda.pipeline.release import run_release

    glob_ = write_dataset(tmp_path / "in", *make_dataset(n_per_class=20, num_classes=2, dim=6))
    out = tmp_path / "out"
    cfg = load_config(None, {"input": glob_, "output": str(out), "epsilon": 5.0, "seed": 1})
    first = run_release(cfg, list(BEAM_ARGS))
    before = _tree(out)
    assert json.loads((out / "manifest.json").read_text()) == first.model_dump(mode="json")
    reached = []

    def broken(workdir, manifest):
        reached.append(sorted(p.name for p in Path(workdir).iterdir()))
        return {"accuracy_mean": 0.5, "per_class": np.array([0.5, 0.5])}

    with pytest.raises(ReleaseError, match="stage broken evaluation: its 'utility' section cannot be written"):
        run_release(
            cfg.model_copy(update={"overwrite": True}),
            list(BEAM_ARGS),
            (Stage("broken evaluation", "utility", broken),),
        )
    assert reached and "synthetic" in reached[0]  # it failed after the pipeline had written the parts
    assert _tree(out) == before
    assert not list(tmp_path.glob("out.tmp-*")) and not list(tmp_path.glob("out.old-*"))


@pytest.mark.parametrize("files, ours", [(3, True), (0, True), ("x", False), ({}, False), (None, False), (-5, False),
                                         (True, False)])  # fmt: skip
def test_an_older_manifests_file_count_is_read_only_as_a_count(files, ours):
    """Manifests written before the input's file count was dropped state ``input.files``: such a release is still
    ours (validates, so ``--overwrite`` replaces it), but only where the field is what we wrote, a count."""
    from dpcda.schemas.manifest import Manifest
    from tests.conftest import valid_manifest

    data = valid_manifest()
    data["input"] = {**data["input"], "files": files}
    if ours:
        assert "files" not in Manifest.model_validate(data).model_dump()["input"]
    else:
        with pytest.raises(pydantic.ValidationError, match="files"):
            Manifest.model_validate(data)
