"""Each mechanism's parameters are a typed model of their own (schemas.mechanism_params), and the Beam-free cores
(dpcda/mechanisms/) receive those and the privacy parameters (schemas.settings), never the whole release config."""

from __future__ import annotations

import ast
import inspect

import pydantic
import pytest

from dpcda.mechanisms import registry
from dpcda.schemas.config import ConfigError, ReleaseConfig, load_config
from dpcda.schemas.mechanism_params import (
    PARAMS,
    DpcdaParams,
    MarginalsParams,
    MechanismParams,
    P3gmParams,
    RandprojParams,
    parse,
)
from dpcda.schemas.settings import CoreSettings, DataParams, ExecutionParams, PostprocessParams, PrivacyParams
from tests.conftest import ROOT

BASE = {"input": "x", "output": "o/r", "epsilon": 1.0, "num_classes": 3}
TABLE = {
    "label": {"name": "y", "categories": ["a", "b", "c"]},
    "columns": [{"name": "v", "kind": "numeric", "lower": 0, "upper": 1}],
}
# the least a config of each mechanism needs besides BASE
NEEDS = {"marginals": {"table": TABLE}}


# ---------------------------------------------------------------- the models


def test_the_name_picks_each_mechanisms_model():
    for name, cls in PARAMS.items():
        params = parse({"name": name})
        assert type(params) is cls and params.name == name
    assert isinstance(parse({"name": "p3gm", "epochs": 3}), P3gmParams)


@pytest.mark.parametrize("data", [{"name": "dpcdaa"}, {"mixing_order": 4}])
def test_a_name_no_model_has_is_one_line(data):
    with pytest.raises(ValueError, match=r"^mechanism: Input should be 'dpcda', 'dpmix'"):
        parse(data)


@pytest.mark.parametrize(
    "data,needle",
    [
        ({"name": "p3gm", "bogus": 1}, "extra_forbidden"),
        ({"name": "dpcda", "epochs": 2}, "extra_forbidden"),  # another mechanism's parameter
        ({"name": "p3gm", "p3gm_epochs": 2}, "extra_forbidden"),  # the flat name is the config's, not the model's
        ({"name": "p3gm", "epochs": "many"}, "float_parsing"),
        ({"name": "randproj", "projection_dim": True}, "expected an integer, got a boolean"),
        ({"name": "marginals", "bins": 1}, "greater_than_equal"),
        ({"name": "marginals", "selection": "greedy"}, "literal_error"),
        ({"name": "dpcda", "sigma_y": -1.0}, "greater_than_equal"),
        ({"name": "dpcda", "projection": "pca:3"}, "string_pattern_mismatch"),
    ],
)
def test_a_bad_mechanism_model_is_refused(data, needle):
    with pytest.raises(pydantic.ValidationError) as err:
        parse(data)
    assert needle in repr(err.value.errors()) or needle in str(err.value)


def test_the_models_are_frozen():
    params = P3gmParams()
    with pytest.raises(pydantic.ValidationError):
        params.epochs = 3.0


@pytest.mark.parametrize("name", sorted(PARAMS))
def test_each_parameter_is_declared_once_in_its_model(name):
    """No mechanism parameter is a config field; its flag is the model's field itself (default, bounds, help)."""
    from dpcda.pipeline.cli.release import release_flags

    cls = PARAMS[name]
    flags = release_flags()
    for field in (*cls.own(), "mixing_order", "samples", "projection"):
        own = field in cls.own()
        key = cls.flat_name(field) if own else field
        assert key not in ReleaseConfig.model_fields
        assert flags["--" + key.replace("_", "-")] == (key, (cls if own else MechanismParams).model_fields[field])


@pytest.mark.parametrize("name", sorted(PARAMS))
def test_a_configs_mechanism_is_its_model_with_the_flat_values(name):
    flat = {cls.flat_name(f): cls.model_fields[f].default for cls in [PARAMS[name]] for f in PARAMS[name].own()}
    cfg = load_config(None, {**BASE, "mechanism": name, **NEEDS.get(name, {}), **flat})
    params = cfg.mechanism
    assert type(params) is PARAMS[name] and params.name == name and cfg.core.params is params
    for field in params.own():
        assert getattr(params, field) == flat[params.flat_name(field)]


def test_flags_and_sections_reach_the_model():
    cfg = load_config(None, {**BASE, "mechanism": "p3gm", "mode": "poisson", "p3gm_epochs": "3", "p3gm_hidden": 64})
    assert cfg.mechanism == P3gmParams(epochs=3.0, hidden=64, mixing_order=1)
    cfg = load_config(None, {**BASE, "mechanism": "randproj", "projection_dim": "7"})
    assert cfg.mechanism == RandprojParams(projection_dim=7, mixing_order=1)
    cfg = load_config(None, {**BASE, "sigma_y": 0.5, "mixing_order": 8})
    assert cfg.mechanism == DpcdaParams(sigma_y=0.5, mixing_order=8)


@pytest.mark.parametrize(
    "text,needle",
    [
        ("mechanism: {name: p3gm, bogus: 2}\n", r"mechanism\.bogus: no such field"),
        ("mechanism: {name: marginals, epochs: 2}\n", r"mechanism\.epochs: a p3gm parameter"),
        ("mechanism: {name: p3gm, epochs: many}\n", r"^p3gm_epochs: Input should be a valid number"),
        ("mechanism: {name: marginals, bins: yes}\n", r"^marginals_bins: expected an integer, got a boolean"),
        ("mechanism: {name: randproj, projection_dim: [3]}\n", r"^projection_dim: Input should be a valid integer"),
        ("mechanism: {name: dpcda, mixing_order: 0}\n", r"^mixing_order: Input should be greater than or equal to 1"),
        ("mechanism: {name: nope}\n", r"^mechanism: Input should be 'dpcda'"),
    ],
)
def test_a_bad_mechanism_section_is_one_line(tmp_path, text, needle):
    (tmp_path / "c.yaml").write_text(f"input: x\noutput: o/r\nepsilon: 1\nnum_classes: 3\n{text}")
    with pytest.raises(ConfigError, match=needle) as err:
        load_config(str(tmp_path / "c.yaml"), {})
    assert "\n" not in str(err.value)


# ---------------------------------------------------------------- mechanisms that do not mix


@pytest.mark.parametrize("name", [n for n, cls in PARAMS.items() if not cls.mixes])
def test_a_mechanism_that_does_not_mix_refuses_a_mixing_order(name):
    """Refused, not ignored: a given mixing order other than 1 (the order such a mechanism has)."""
    fields = {**BASE, "mechanism": name, **NEEDS.get(name, {})}
    assert load_config(None, fields).mechanism.mixing_order == 1
    assert load_config(None, {**fields, "mixing_order": 1}).mechanism.mixing_order == 1
    with pytest.raises(ConfigError, match=rf"^mixing_order: {name} does not mix records \(leave it out\)$"):
        load_config(None, {**fields, "mixing_order": 4})


def test_marginals_refuses_a_mixing_order_from_a_config_file(tmp_path):
    (tmp_path / "c.yaml").write_text("mechanism: dpcda\nmixing_order: 4\n")
    over = {**BASE, "table": TABLE, "mechanism": "marginals"}
    with pytest.raises(ConfigError, match="^mixing_order: marginals does not mix records"):
        load_config(str(tmp_path / "c.yaml"), over)
    # the examples name no mixing order, so they run with any mechanism (docs/tables.md runs wa_churn with marginals)
    cfg = load_config(
        str(ROOT / "examples" / "wa_churn.yaml"), {"input": "x", "output": "o/r", "epsilon": 1.0, "mechanism": "dpcda"}
    )
    assert cfg.mechanism.mixing_order == 4 and "mixing_order" not in cfg.mechanism.model_fields_set
    marginals = load_config(
        str(ROOT / "examples" / "wa_churn.yaml"),
        {"input": "x", "output": "o/r", "epsilon": 1.0, "mechanism": "marginals"},
    )
    assert marginals.mechanism.mixing_order == 1


@pytest.mark.parametrize("name", ["p3gm", "marginals"])
def test_the_generative_mechanisms_take_samples(name):
    """They sample T rows from a fitted model: samples is theirs (local and randproj release one row per record)."""
    cfg = load_config(None, {**BASE, "mechanism": name, "samples": 50, **NEEDS.get(name, {})})
    assert cfg.mechanism.samples == 50
    assert isinstance(cfg.mechanism, (P3gmParams, MarginalsParams))


# ---------------------------------------------------------------- what the cores receive


def test_the_core_settings_hold_only_privacy_mechanism_and_execution_fields():
    cfg = load_config(None, {**BASE, "chunk_rows": 64, "seed": 3, "mixing_order": 2})
    core = cfg.core
    assert isinstance(core, CoreSettings) and core.params == cfg.mechanism
    assert core.privacy == cfg.privacy and core.privacy.reproducible and core.execution.chunk_rows == 64
    launcher_only = {
        "output", "input_format", "features_column", "out_of_bounds", "ledger", "dataset_id", "budget_cap",
        "eval_input", "eval_input_public", "eval_runs", "eval_epochs", "audit", "membership_audit", "overwrite",
        "output_shards", "noise_threads", "normalization_file", "allow_exact_normalization", "seed", "input",
    }  # fmt: skip
    for part in (PrivacyParams, DataParams, PostprocessParams, ExecutionParams):
        names = {f.name for f in part.__dataclass_fields__.values()}
        assert not names & launcher_only, (part.__name__, names & launcher_only)


def _mechanism_modules():
    return sorted((ROOT / "dpcda" / "mechanisms").glob("*.py"))


def test_no_core_module_reaches_the_release_config():
    """No module under dpcda/mechanisms/ imports the config, names it, takes a ``cfg`` or reads ``.cfg`` (jax's
    ``jax.config`` is not ours)."""
    found = []
    for path in _mechanism_modules():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            where = f"{path.name}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dpcda.schemas.config"):
                found.append(f"{where}: imports {node.module}")
            elif isinstance(node, ast.Name) and node.id in ("ReleaseConfig", "load_config"):
                found.append(f"{where}: names {node.id}")
            elif isinstance(node, ast.Attribute) and node.attr == "cfg":
                found.append(f"{where}: reads .{node.attr}")
            elif isinstance(node, ast.arg) and node.arg in ("cfg", "config"):
                found.append(f"{where}: takes {node.arg}")
    assert not found, found


# a Mechanism method that reads settings -> the parameters it may take besides its data
SETTINGS_METHODS = {
    "budget_shares": {"privacy", "params"},
    "plan": {"public"},  # mechanisms.base.Public: the core settings and public facts, no record
    "check_before_work": {"core", "dim"},
    "output_dim": {"params", "dim"},
}


@pytest.mark.parametrize("name", registry.NAMES)
def test_every_entry_takes_typed_settings(name):
    entry = registry.get(name)
    for method, allowed in SETTINGS_METHODS.items():
        taken = set(inspect.signature(getattr(entry, method)).parameters)
        assert taken <= allowed, (name, method, taken - allowed)


def test_the_plan_and_the_in_process_release_take_core_settings_not_the_config():
    import numpy as np

    from dpcda.mechanisms.inprocess import first_pass, release_in_process
    from dpcda.mechanisms.plan import build_plan
    from dpcda.privacy.noise import key_from_test_seed

    for fn in (build_plan, release_in_process):
        assert "core" in inspect.signature(fn).parameters and "cfg" not in inspect.signature(fn).parameters
    rng = np.random.default_rng(0)
    x, y = rng.uniform(size=(60, 4)), np.repeat(np.arange(3), 20)
    cfg = load_config(None, {**BASE, "seed": 1})
    key = key_from_test_seed(1)
    plan = build_plan(first_pass(x, y), cfg.core, key)
    assert plan.mechanism == "dpcda" and plan.samples_total == 60
    feats, labels, plan2, _ = release_in_process(x, y, cfg.core, key)
    assert feats.shape == (60, 4) and plan2.synthesis.sigma_x == plan.synthesis.sigma_x
    with pytest.raises(AttributeError):  # the config is not a stand-in for the core settings
        build_plan(first_pass(x, y), cfg, key)


def test_every_model_is_a_mechanism_params():
    assert all(issubclass(cls, MechanismParams) for cls in PARAMS.values())


def test_account_checks_the_mechanisms_knobs_in_one_line():
    """``dpcda account`` builds the mechanism's model too: a bad knob is one line, not a wall of pydantic text."""
    from dpcda.api import account
    from dpcda.privacy.calibration import CalibrationError

    with pytest.raises(CalibrationError, match=r"^label_noise_ratio: Input should be greater than 0$"):
        account("dpmix", class_size=100, samples_per_class=100, epsilon=1.0, label_noise_ratio=0.0)
    assert account("dpmix", class_size=100, samples_per_class=100, epsilon=1.0, label_noise_ratio=0.5)["sigma_y"] > 0
