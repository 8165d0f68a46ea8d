"""Config: YAML/JSON file + flag overrides, validated by pydantic with errors that name the field."""

from __future__ import annotations

import json

import pytest

from dpcda.schemas.config import ConfigError, load_config
from dpcda.schemas.mechanism_params import owner_of
from tests.plan_record import TABLE


def test_yaml_file_with_flag_overrides(tmp_path):
    path = tmp_path / "release.yaml"
    path.write_text("input: 'in/*.parquet'\noutput: out\nmixing-order: 8\nepsilon: 4\nfeature_bounds: [-1, 1]\n")
    cfg = load_config(str(path), {"epsilon": 6.0, "mode": None})
    assert (cfg.mechanism.mixing_order, cfg.epsilon, cfg.feature_bounds, cfg.mode) == (8, 6.0, (-1.0, 1.0), "fixed")


def test_json_file(tmp_path):
    path = tmp_path / "release.json"
    path.write_text(json.dumps({"input": "x", "output": "y", "sigma_x": 0.5, "mode": "fixed", "num_classes": 3}))
    cfg = load_config(str(path), {})
    assert cfg.sigma_x == 0.5 and cfg.num_classes == 3 and not cfg.reproducible


@pytest.mark.parametrize(
    "overrides,needle",
    [
        ({"mixing_order": 0}, "mixing_order"),
        ({"clip": -1.0}, "clip"),
        ({"delta": 2.0}, "delta"),
        ({"feature_bounds": "1"}, "feature_bounds"),
        ({"mode": "uniform"}, "mode"),
        ({"bogus_field": 1}, "bogus_field"),
        ({"sigma_x": 1.0}, "epsilon and sigma_x"),
        ({"normalization": "public"}, "normalization_file"),
        ({"normalization_budget_share": 0.45, "histogram_budget_share": 0.1}, "normalization_budget_share"),
    ],
)
def test_errors_name_the_field(overrides, needle):
    with pytest.raises(ConfigError) as err:
        load_config(None, {"input": "a", "output": "b", "epsilon": 1.0, **overrides})
    assert needle in str(err.value)
    assert "\n" not in str(err.value)


def test_epsilon_or_sigma_is_required():
    with pytest.raises(ConfigError, match="epsilon: give a target epsilon"):
        load_config(None, {"input": "a", "output": "b"})


def test_missing_config_file_is_reported(tmp_path):
    with pytest.raises(ConfigError, match="--config: .*no such file"):
        load_config(str(tmp_path / "nope.yaml"), {})


def test_image_shape_parses_and_needs_lowpass():
    cfg = load_config(None, {"input": "a", "output": "b", "epsilon": 1.0, "lowpass": 8, "image_shape": "3,32,32"})
    assert cfg.image_shape == (3, 32, 32)
    for bad in ("28", "a,b", "0,28", "1,2,3,4", 784, [28.5, 28], True):
        with pytest.raises(ConfigError, match="image_shape"):
            load_config(None, {"input": "a", "output": "b", "epsilon": 1.0, "lowpass": 8, "image_shape": bad})
    with pytest.raises(ConfigError, match="only used with --lowpass"):
        load_config(None, {"input": "a", "output": "b", "epsilon": 1.0, "image_shape": "28,28"})
    with pytest.raises(ConfigError, match="lowpass"):
        load_config(None, {"input": "a", "output": "b", "epsilon": 1.0, "lowpass": 0})


def test_a_poisson_release_below_the_pld_accountants_delta_floor_is_refused_before_work():
    base = {"input": "x", "output": "y", "epsilon": 4.0, "num_classes": 10}
    with pytest.raises(ConfigError, match=r"delta: 1e-09 is below 1\.02e-08, the least a poisson release can state"):
        load_config(None, {**base, "mode": "poisson", "delta": 1e-9})
    assert load_config(None, {**base, "mode": "poisson", "delta": 1.02e-8}).delta == 1.02e-8
    # the check is the plan's own arithmetic: a delta a hair above 1e-8 / (1 - share) in real numbers, whose
    # accountant share rounds below 1e-8, is refused here and not after the data is read
    near = {**base, "mode": "poisson", "histogram_budget_share": 0.4}
    with pytest.raises(ConfigError, match=r"below 1\.67e-08"):
        load_config(None, {**near, "delta": 1.666669444449074e-08})
    assert load_config(None, {**near, "delta": 1.67e-08}).delta == 1.67e-08
    with pytest.raises(ConfigError, match=r"raise delta\)?$"):  # p3gm is add/remove only: no 'use --mode fixed'
        load_config(None, {**base, "mechanism": "p3gm", "mode": "poisson", "delta": 1e-9})
    assert load_config(None, {**base, "mode": "fixed", "delta": 1e-12}).delta == 1e-12  # RDP: no such floor
    # fixed mode's DP statistics are one Gaussian, calibrated alone: exact down to 1e-14 (after the sampler's share)
    with pytest.raises(ConfigError, match=r"delta: 1e-14 is below 1\.01e-14, the least the DP statistics"):
        load_config(None, {**base, "mode": "fixed", "delta": 1e-14})
    assert load_config(None, {**base, "mode": "fixed", "delta": 1e-20, "sigma_x": 0.5, "epsilon": None}).delta == 1e-20


def test_every_config_field_is_in_one_section_and_help_shows_them_grouped():
    from dpcda.pipeline.cli.release import HELP_GROUPS
    from dpcda.schemas.config import SECTIONS, ReleaseConfig
    from tests.conftest import run_cli

    placed = [name for names in SECTIONS.values() for name in names]
    assert sorted(placed) == sorted(ReleaseConfig.model_fields), "each field in exactly one section"
    grouped = [s for sections in HELP_GROUPS.values() for s in sections]
    assert sorted(grouped) == sorted(SECTIONS), "each section in exactly one group of the help"
    text = run_cli("release", "--help").stdout
    heads = [line[: -len(" options:")] for line in text.splitlines() if line.endswith(" options:") and line[0] != " "]
    assert heads == list(HELP_GROUPS), heads
    body = text[text.index("input options:") :]
    assert body.index("  --epsilon") > body.index("privacy options:") > body.index("  --label-column")
    assert body.index("  --p3gm-epochs") > body.index("  --mechanism") > body.index("mechanism options:")


SECTIONED = """
input: {path: 'in/*.parquet', num_classes: 10, feature_bounds: [0, 255]}
privacy: {epsilon: 2, mode: poisson, delta: 1.0e-6}
mechanism: {name: p3gm, epochs: 3, latent_dim: 8, batch: 500}
scale: {chunk_rows: 1024}
output: {path: releases/p3gm-eps2, overwrite: true}
"""
FLAT = """
input: 'in/*.parquet'
num_classes: 10
feature_bounds: [0, 255]
epsilon: 2
mode: poisson
delta: 1.0e-6
mechanism: p3gm
p3gm_epochs: 3
p3gm_latent_dim: 8
p3gm_batch: 500
chunk_rows: 1024
output: releases/p3gm-eps2
overwrite: true
"""


def test_a_config_file_grouped_by_section_is_the_flat_one(tmp_path):
    (tmp_path / "s.yaml").write_text(SECTIONED)
    (tmp_path / "f.yaml").write_text(FLAT)
    sectioned, flat = load_config(str(tmp_path / "s.yaml"), {}), load_config(str(tmp_path / "f.yaml"), {})
    assert sectioned == flat
    assert sectioned.mechanism.epochs == 3.0 and sectioned.mechanism.latent_dim == 8
    assert sectioned.model_fields_set == flat.model_fields_set


@pytest.mark.parametrize(
    "text,needle",
    [
        (
            "input: x\noutput: y\nprivacy: {epsilon: 1, chunk_rows: 8}\n",
            r"privacy\.chunk_rows: belongs in section scale",
        ),
        ("input: x\noutput: y\nepsilon: 1\nprivacy: {epsilon: 2}\n", r"epsilon is given twice \(epsilon and privacy"),
        ("input: x\noutput: y\nepsilon: 1\nmechanism: {name: dpcda, epochs: 2}\n", r"mechanism\.epochs: a p3gm"),
        (
            "input: x\noutput: y\nepsilon: 1\nmechanism: {name: dpmix, sigma_y: 2}\n",
            r"sigma_y: a dpcda parameter; this release.s mechanism is dpmix",
        ),
        ("input: x\noutput: y\nepsilon: 1\nprivacy: {bogus: 2}\n", r"privacy\.bogus: no such field"),
    ],
)
def test_a_key_outside_its_section_is_one_line(tmp_path, text, needle):
    (tmp_path / "c.yaml").write_text(text)
    with pytest.raises(ConfigError, match=needle):
        load_config(str(tmp_path / "c.yaml"), {})


@pytest.mark.parametrize(
    "mechanism,needle",
    [
        (
            {"name": "p3gm", "em_budget_share": 0.3, "p3gm_em_budget_share": 0.1},
            r"p3gm_em_budget_share is given twice \(mechanism\.em_budget_share and mechanism\.p3gm_em_budget_share\)",
        ),
        (
            {"name": "p3gm", "p3gm_em_budget_share": 0.1, "em_budget_share": 0.3},
            r"p3gm_em_budget_share is given twice",
        ),
        ({"name": "p3gm", "em-budget-share": 0.3, "em_budget_share": 0.1}, r"em_budget_share is given twice"),
    ],
)
def test_a_python_mapping_that_gives_a_parameter_twice_is_refused_as_a_file_is(tmp_path, mechanism, needle):
    base = {"input": "x", "output": "y", "epsilon": 1.0, "num_classes": 3}
    with pytest.raises(ConfigError, match=needle):
        load_config(None, {**base, "mechanism": mechanism})
    (tmp_path / "c.json").write_text(json.dumps({**base, "mechanism": mechanism}))
    with pytest.raises(ConfigError, match="given twice"):  # the same mapping in a file
        load_config(str(tmp_path / "c.json"), {})
    # given once, under either spelling, it is taken; a flat key (a flag) still overrides the mapping
    once = load_config(None, {**base, "mechanism": {"name": "p3gm", "p3gm_em_budget_share": 0.1}})
    assert once.mechanism.em_budget_share == 0.1
    flag = load_config(
        None, {**base, "mechanism": {"name": "p3gm", "em_budget_share": 0.1}, "p3gm_em_budget_share": 0.2}
    )
    assert flag.mechanism.em_budget_share == 0.2


@pytest.mark.parametrize(
    "overrides,needle",
    [
        ({"mechanism": "dpcda", "p3gm_epochs": 5}, "p3gm_epochs: a p3gm parameter; this release's mechanism is dpcda"),
        ({"mechanism": "local", "projection_dim": 20}, "projection_dim: a randproj parameter"),
        ({"mechanism": "dpcda", "label_noise_ratio": 2.0}, "label_noise_ratio: a dpmix parameter"),
    ],
)
def test_a_parameter_of_another_mechanism_is_refused(overrides, needle):
    with pytest.raises(ConfigError, match=needle):
        load_config(None, {"input": "x", "output": "y", "epsilon": 1.0, "num_classes": 3, **overrides})
    # its default value is no choice, so it passes (flags and older files name defaults)
    owners = {k: owner_of(k) for k in overrides if k != "mechanism"}
    default = {k: model.model_fields[field].default for k, (model, field) in owners.items()}
    load_config(None, {"input": "x", "output": "y", "epsilon": 1.0, "num_classes": 3, **overrides, **default})


def test_the_sectioned_example_in_the_operations_guide_loads(tmp_path):
    from tests.conftest import ROOT

    text = (ROOT / "docs" / "operations.md").read_text()
    block = text.split("## The config file", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    (tmp_path / "c.yaml").write_text(block)
    cfg = load_config(str(tmp_path / "c.yaml"), {})
    expected = ("p3gm", 20.0, "poisson", "releases/p3gm-eps2")
    assert (cfg.mechanism.name, cfg.mechanism.epochs, cfg.mode, cfg.output) == expected


def test_the_config_holds_each_parameter_once_and_the_mechanism_nested():
    """ReleaseConfig has at most 45 fields; a mechanism's parameters are its model's (``mechanism``), whatever their
    spelling: a nested mapping, flat keys (older files, flags, the API's keywords) or the file's mechanism section."""
    from dpcda.schemas.config import ReleaseConfig, mechanism_keys

    assert len(ReleaseConfig.model_fields) <= 45
    assert not set(ReleaseConfig.model_fields) & (set(mechanism_keys()) - {"mechanism"})
    base = {"input": "x", "output": "o/r", "epsilon": 1.0, "num_classes": 3}
    nested = load_config(None, {**base, "mechanism": {"name": "marginals", "selection": "aim"}, "table": TABLE})
    flat = load_config(None, {**base, "mechanism": "marginals", "marginals_selection": "aim", "table": TABLE})
    built = ReleaseConfig(**base, mechanism="marginals", marginals_selection="aim", table=TABLE)
    assert nested == flat == built and nested.mechanism.selection == "aim" and nested.mode == "poisson"
    # a flag over the same parameter in the file's mechanism section: the flag wins, as over any other field
    over = load_config(None, {**base, "mechanism": {"name": "dpcda", "mixing_order": 8}, "mixing_order": "16"})
    assert over.mechanism.mixing_order == 16


def test_a_table_defaults_to_marginals_under_add_remove_and_rows_to_dpcda(tmp_path):
    """Which mechanism a config without one takes is ``config_keys.default_mechanism``'s answer on the raw config: a
    table (a table: section, or the one-command path's label) takes marginals, whose only mode is poisson (no exact
    class size published); image and vector rows take dpcda, fixed. A mechanism named wins."""
    from dpcda.schemas import config_keys

    base = {"input": "x", "output": "o/r", "epsilon": 1.0}
    assert (
        config_keys.default_mechanism({"table": TABLE}) == "marginals" == config_keys.default_mechanism({"label": "y"})
    )
    rows = load_config(None, {**base, "num_classes": 3})
    assert (rows.mechanism.name, rows.mode) == ("dpcda", "fixed")
    table = load_config(None, {**base, "table": TABLE})
    assert (table.mechanism.name, table.mode) == ("marginals", "poisson")
    mixed = load_config(None, {**base, "table": TABLE, "mechanism": "dpcda"})
    assert (mixed.mechanism.name, mixed.mode) == ("dpcda", "fixed")
    # the one-command path: --label (and --drop-columns) become the table: section, in a file's input section too
    one = load_config(None, {**base, "label": "y", "drop_columns": "a, b"})
    assert (one.mechanism.name, one.mode) == ("marginals", "poisson") and one.derives_label
    assert one.table.label.name == "y" and one.table.drop == ["a", "b"] and one.num_classes is None
    conf = tmp_path / "c.yaml"
    conf.write_text("input: {path: x, label: y, drop_columns: [a]}\noutput: o/r\nprivacy: {epsilon: 1}\n")
    assert load_config(str(conf), {}).table.drop == ["a"]
    with pytest.raises(ConfigError, match="^label: z, but the table: section's label is"):
        load_config(None, {**base, "table": TABLE, "label": "z"})
    with pytest.raises(ConfigError, match="^table: the label's categories and every column's domain must be declared"):
        load_config(None, {**base, "label": "y", "mechanism": "dpcda"})


def test_release_help_is_grouped_short_and_in_plain_words():
    """Issue 53.6: groups a newcomer can scan, the Beam runner named, no paper numbers, one default per option."""
    import re

    from tests.conftest import run_cli

    text = run_cli("release", "--help", env={"COLUMNS": "80"}).stdout
    lines = text.splitlines()
    assert len(lines) < 270, len(lines)  # the flat list it replaces had 270 lines at 80 columns
    assert len(lines[0]) < 130  # a usage line, not every flag again
    for words in ("--runner", "DirectRunner", "DataflowRunner", "Beam pipeline option"):
        assert words in text, words
    assert not re.search(r"seed 00\d", text)
    options = re.split(r"\n  (?=-)", text[text.index("input options:") :])
    for option in options:
        assert len(re.findall(r"default", option, re.IGNORECASE)) <= 1, option
