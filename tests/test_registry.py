"""The mechanism registry: every mechanism is an entry that answers for itself, and nothing else compares names."""

from __future__ import annotations

import re

import pytest

from dpcda.mechanisms import registry
from dpcda.mechanisms.base import Mechanism
from dpcda.schemas.config import MECHANISM_NAMES, ReleaseConfig
from dpcda.schemas.mechanism_params import PARAMS
from tests.conftest import ROOT

# The mechanisms' own modules and the registry may name mechanisms; the config looks a mechanism's rules up by name
# (schemas/mechanism_params.py) and compares none.
OWN = {"registry.py", "base.py", "dpcda.py", "dpmix.py", "local.py", "randproj.py", "p3gm.py", "marginals.py"}
NAME = "|".join(registry.NAMES)
COMPARISON = re.compile(rf"""(==|!=)\s*["']({NAME})["']|["']({NAME})["']\s*(==|!=)|\bin\s*[(\[{{]\s*["']({NAME})["']""")


def test_the_registry_and_the_config_name_the_same_mechanisms():
    assert registry.NAMES == MECHANISM_NAMES == tuple(PARAMS)
    assert all(isinstance(m, Mechanism) and m.name == n for n, m in registry.MECHANISMS.items())


def test_no_mechanism_name_is_compared_outside_the_registry_and_the_mechanisms_modules():
    found = []
    for path in sorted((ROOT / "dpcda").rglob("*.py")):
        rel = path.relative_to(ROOT / "dpcda").as_posix()
        if rel.startswith("mechanisms/") and (path.name in OWN or rel.split("/")[1] + ".py" in OWN):  # or a package
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if COMPARISON.search(line):
                found.append(f"{rel}:{n}: {line.strip()}")
    assert not found, found


def test_an_unknown_name_is_one_line():
    with pytest.raises(registry.UnknownMechanism, match=r"^mechanism: 'dpcdaa' is not one of dpcda, dpmix"):
        registry.get("dpcdaa")


@pytest.mark.parametrize("name", registry.NAMES)
def test_every_entry_supplies_what_the_release_asks(name):
    """Each entry names a PTransform and a canary game (or none) that exist, offers at least one mode, and plans its own
    synthesis: one event per group, its manifest section, its summary line, what account prints of it."""
    from dpcda.mechanisms.base import Grouping, SynthesisPlan, resolve
    from dpcda.mechanisms.plan import plan_release
    from dpcda.pipeline.release import synthesis_transform

    m = registry.get(name)
    assert m.modes and set(m.modes) <= {"fixed", "poisson"} and isinstance(m.grouping, Grouping)
    assert synthesis_transform(m).__name__ == m.graph.split(":")[1]
    assert m.label_caveat() and m.relation(m.modes[0])
    assert not m.audit_game or isinstance(resolve(m.audit_game)(), object)
    if m.params.needs_table:
        return  # planned on a table's columns (tests/test_marginals.py)
    narrow = {"projection_dim": 3} if "projection_dim" in PARAMS[name].own() else {}
    small = {"p3gm_latent_dim": 2, "p3gm_hidden": 8, "p3gm_epochs": 0.5} if name == "p3gm" else {}
    cfg = ReleaseConfig(input="x", output="y", mechanism=name, epsilon=4.0, num_classes=2, **narrow, **small)
    planned, _ = plan_release(cfg.core, dim=5, class_sizes=[50, 60])
    plan = planned.synthesis
    assert isinstance(plan, SynthesisPlan) and len(plan.events) == m.grouping.count(2)
    assert all(e.noise_multiplier > 0 for e in plan.events) and planned.accounting.epsilon <= 4.0
    assert "=" in plan.summary() and plan.account_figures(1.0) and plan.gaussian_draws(dim=5, num_classes=2) > 0


def test_the_p3gm_manifest_says_what_p3gm_does():
    """Its label caveat is its own: no 'every record is released once', no replace-one relation."""
    caveat = registry.get("p3gm").label_caveat()
    assert "sampled from a model" in caveat and "released once" not in caveat and "replace-one" not in caveat


@pytest.mark.parametrize("name", registry.NAMES)
def test_the_config_rules_and_the_entry_agree_on_modes_and_mixing(name):
    entry, params = registry.get(name), PARAMS[name]
    assert (entry.modes, entry.mixes) == (params.modes, params.mixes)
