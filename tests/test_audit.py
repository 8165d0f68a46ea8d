"""Empirical privacy audit (privacy/audit.py): the bound stays below the accounting, broken claims are caught.

Statistical tests use fixed seeds, so they are deterministic. Under the model, each bound exceeds the
true epsilon with probability <= 5 % (Clopper-Pearson, union bound), and the attack reaches about half
the accounted epsilon, so a correct accountant failing a 'bound <= accounted' test here would need an
error rate event far below 1e-6; the "caught" tests have margins of 1 or more in epsilon.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from dpcda.evaluation.audit import (
    audit_section,
    clopper_pearson_upper,
    epsilon_lower_bound,
    run_audit,
    run_paper_rate_audit,
)
from dpcda.schemas.manifest import Manifest
from tests.conftest import run_cli, valid_manifest

TRIALS = 10000


def test_clopper_pearson_upper_exact_cases():
    # k = 0: the bound solves (1 - p)^n = alpha.
    assert clopper_pearson_upper(0, 1000, 0.025)[()] == pytest.approx(1 - 0.025 ** (1 / 1000), rel=1e-9)
    assert clopper_pearson_upper(10, 10, 0.025)[()] == 1.0
    rng = np.random.default_rng(0)  # coverage: the true rate is below the bound in >= 97.5 % of draws
    k = rng.binomial(200, 0.1, size=4000)
    assert np.mean(clopper_pearson_upper(k, 200, 0.025) >= 0.1) >= 0.975


def test_epsilon_lower_bound_formula():
    assert epsilon_lower_bound(0.01, 0.5, 0.0) == pytest.approx(math.log(0.5 / 0.01))
    assert epsilon_lower_bound(0.5, 0.01, 0.0) == pytest.approx(math.log(0.5 / 0.01))
    assert epsilon_lower_bound(0.5, 0.5, 1e-5) == 0.0  # a coin flip proves nothing
    assert epsilon_lower_bound(1.0, 1.0, 1e-5) == 0.0


@pytest.mark.parametrize("mode", ["fixed", "poisson"])
@pytest.mark.parametrize("epsilon,l,class_size,samples", [(2, 2, 2, 1), (4, 2, 2, 1), (8, 4, 6, 1), (4, 2, 4, 3)])
def test_bound_never_exceeds_accounted(mode, epsilon, l, class_size, samples):
    r = run_audit(
        mode=mode,
        mixing_order=l,
        epsilon=epsilon,
        class_size=class_size,
        samples_per_class=samples,
        trials=TRIALS,
        seed=1,
        device="cpu",
    )
    assert r["accounted_epsilon"] <= epsilon + 1e-9
    assert 0.0 <= r["empirical_epsilon_lower_bound"] <= r["accounted_epsilon"]
    assert not r["violation"]
    assert r["fp"] <= r["fp_upper"] and r["fn"] <= r["fn_upper"]
    assert r["trials"] == TRIALS and r["evaluation_trials"] == TRIALS // 2
    if class_size == l and epsilon >= 4:  # a strong canary in a tiny class: the bound means something
        assert r["empirical_epsilon_lower_bound"] > 1.0


@pytest.mark.parametrize("mode", ["fixed", "poisson"])
def test_noise_off_is_caught(mode):
    r = run_audit(
        mode=mode, mixing_order=2, sigma_x=0.0, class_size=2, trials=TRIALS, seed=2, claimed_epsilon=4.0, device="cpu"
    )
    assert math.isinf(r["accounted_epsilon"])
    assert r["fp"] == 0.0 and r["fn"] == 0.0
    assert r["empirical_epsilon_lower_bound"] > 5.5 and r["violation"]


@pytest.mark.parametrize("mode", ["fixed", "poisson"])
def test_paper_rate_claim_is_caught(mode):
    """Accounting with p = l/N (N = 10 classes x 2) while rows sample a class of 2: the claim is too low."""
    r = run_paper_rate_audit(
        mode=mode,
        mixing_order=2,
        epsilon=2.0,
        num_classes=10,
        class_size=2,
        samples_per_class=10,
        trials=TRIALS,
        seed=3,
        device="cpu",
    )
    assert r["claimed_epsilon"] == 2.0 and r["violation"]
    assert r["empirical_epsilon_lower_bound"] > 3.0
    # the honest per-class accounting of the same sigma_x is not contradicted
    assert r["empirical_epsilon_lower_bound"] <= r["accounted_epsilon"]


def test_noiseless_privacy_is_informational():
    r = run_audit(mode="fixed", mixing_order=2, epsilon=4.0, class_size=2, trials=200, seed=0, device="cpu")
    info = r["noiseless_privacy"]
    assert r["noiseless_privacy_epsilon"] == info["epsilon"] > 0
    assert "NOT a guarantee" in info["note"]
    assert info["delta"] > 0.5  # 4/(5 sqrt(n)) alone: vacuous for n = l = 2


def test_invalid_configuration_names_the_problem():
    from dpcda.evaluation.audit import AuditError

    with pytest.raises(AuditError, match="class_size"):
        run_audit(mode="fixed", mixing_order=4, epsilon=4.0, class_size=3)
    with pytest.raises(AuditError, match="exactly one"):
        run_audit(mode="fixed", mixing_order=2, epsilon=4.0, sigma_x=1.0)


def test_cli_audit_json():
    p = run_cli("audit", "--mode", "fixed", "--mixing-order", "2", "--epsilon", "4", "--trials", "500", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["mode"] == "fixed" and out["trials"] == 500
    assert 0 <= out["empirical_epsilon_lower_bound"] <= out["accounted_epsilon"] <= 4.0


def test_cli_audit_table_and_bad_input():
    p = run_cli("audit", "--mode", "poisson", "--mixing-order", "2", "--epsilon", "4", "--trials", "500")
    assert p.returncode == 0, p.stderr
    assert "empirical_epsilon_lower_bound" in p.stdout and "NOT a guarantee" in p.stdout
    bad = run_cli("audit", "--mode", "fixed", "--mixing-order", "4", "--epsilon", "4", "--class-size", "3")
    assert bad.returncode == 2 and "class_size" in bad.stderr


def _manifest(sigma_x=1.0, mode="fixed"):
    return valid_manifest(sigma_x, mode)


@pytest.mark.parametrize("sigma_x", [1.0, 0.0])
def test_audit_section_fits_the_manifest(sigma_x):
    manifest = _manifest(sigma_x)
    audit = audit_section(manifest, trials=1000)
    Manifest(**{**manifest, "audit": audit})  # the section validates in the manifest (JSON-safe, no infinities)
    assert json.loads(json.dumps(audit)) == audit
    assert "not on the released data" in audit["note"]
    assert audit["sigma_x"] == sigma_x and audit["mode"] == "fixed" and audit["mixing_order"] == 2
    assert audit["max_detectable_epsilon"] > 0
    if sigma_x == 0:
        assert audit["accounted_epsilon"] is None  # infinite: JSON null, as elsewhere in the manifest
    else:
        assert audit["empirical_epsilon_lower_bound"] <= audit["accounted_epsilon"]


@pytest.mark.slow
def test_release_with_audit_writes_section(small_parquet, tmp_path):
    inp, _, _ = small_parquet
    p = run_cli(
        "release",
        "--input",
        inp,
        "--output",
        tmp_path / "out",
        "--mode",
        "poisson",
        "--num-classes",
        "3",
        "--mixing-order",
        "2",
        "--epsilon",
        "4",
        "--seed",
        "1",
        "--audit",
    )
    assert p.returncode == 0, p.stderr
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    audit = manifest["audit"]
    assert audit["sigma_x"] == manifest["mechanism"]["sigma_x"] and audit["mode"] == "poisson"
    assert audit["empirical_epsilon_lower_bound"] <= audit["accounted_epsilon"]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["fixed", "poisson"])
@pytest.mark.parametrize("epsilon,l,class_size", [(1, 2, 2), (4, 2, 2), (8, 2, 2), (4, 4, 8), (10, 4, 4)])
def test_bound_never_exceeds_accounted_large(mode, epsilon, l, class_size):
    r = run_audit(mode=mode, mixing_order=l, epsilon=epsilon, class_size=class_size, trials=100_000, seed=11)
    assert 0.0 <= r["empirical_epsilon_lower_bound"] <= r["accounted_epsilon"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("mode", ["fixed", "poisson"])
def test_gpu_audit(mode):
    r = run_audit(mode=mode, mixing_order=2, epsilon=8.0, class_size=2, trials=400_000, seed=5, device="cuda")
    assert r["device"] == "cuda"
    assert 3.0 < r["empirical_epsilon_lower_bound"] <= r["accounted_epsilon"]


@pytest.mark.parametrize("mechanism,l", [("dpcda", 4), ("dpmix", 4), ("local", 1), ("randproj", 1)])
def test_every_mechanism_audits_below_its_accounted_epsilon(mechanism, l):
    """The canary game on each mechanism's own synthesis code; false alarm <= 5 % by construction."""
    r = run_audit(
        mechanism=mechanism, mode="fixed", mixing_order=l, epsilon=2.0, class_size=max(l, 4), trials=20000, seed=3
    )
    assert r["mechanism"] == mechanism and r["accounted_epsilon"] <= 2.0
    assert not r["violation"] and r["empirical_epsilon_lower_bound"] <= r["accounted_epsilon"]


def test_dpmix_accounted_as_if_its_labels_were_free_is_caught():
    """sigma_x calibrated to eps 1 ignoring the label term, labels noised at a quarter of that: really eps ~3.4."""
    from dpcda.privacy.accounting import accountant_delta
    from dpcda.privacy.calibration import calibrate_noise
    from dpcda.privacy.events import DpmixEvent

    sx = calibrate_noise(
        "fixed",
        lambda s: [DpmixEvent("fixed", 4, 1, 4, 1.0, s, 1e12)],
        target_epsilon=1.0,
        delta=accountant_delta(1e-5),
    )
    r = run_audit(
        mechanism="dpmix",
        mode="fixed",
        mixing_order=4,
        class_size=4,
        sigma_x=sx,
        trials=40000,
        claimed_epsilon=1.0,
        label_noise_ratio=0.25,
        seed=1,
    )
    assert r["violation"] and r["empirical_epsilon_lower_bound"] > 1.0
    assert r["accounted_epsilon"] > 3.0  # the honest accounting knows


@pytest.mark.parametrize("case", ["dpmix", "local", "randproj"])
def test_audit_section_plays_the_releases_own_mechanism(case, tmp_path):
    """The manifest's audit section runs the game of the mechanism that made the release (its relation, its
    events), for mechanisms without a mixing order too."""
    from tests import golden
    from tests.conftest import ROOT

    recorded = json.loads((ROOT / "tests" / "recorded" / "golden_rows.json").read_text())[case]["manifest"]
    audit = audit_section(recorded, trials=400)
    assert audit["mechanism"] == case and audit["mode"] == recorded["mechanism"]["mode"]
    assert audit["neighbouring_relation"] == recorded["privacy"]["neighbouring_relation"]
    assert case != "randproj" or "release's R is not exercised" in audit["scope"]
    assert golden.CASES[case]  # the recorded release this manifest came from


def test_audit_cli_refuses_a_mode_the_mechanism_does_not_offer():
    from tests.conftest import run_cli

    res = run_cli("audit", "--mechanism", "local", "--mode", "poisson", "--epsilon", "1", "--trials", "10")
    assert res.returncode == 2 and "mode: local offers mode fixed only" in res.stderr


def test_a_p3gm_audit_past_a_releases_epochs_is_one_line_naming_the_bound():
    """The game calibrates the noise a p3gm release with these settings gets; 1200 steps at q = 1 are 1199.5 epochs,
    more than a release may run (p3gm_epochs <= 1000): refused in one line, before any trial."""
    args = ["--mechanism", "p3gm", "--mixing-order", "20", "--class-size", "20", "--epsilon", "50", "--trials", "4"]
    res = run_cli("audit", *args, "--samples-per-class", "1200")
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and lines[0].startswith("dpcda: error: audit:"), res.stderr
    assert "p3gm_epochs" in lines[0] and "1000" in lines[0] and "--samples-per-class" in lines[0]
    assert "Traceback" not in res.stderr and res.stdout == ""
    # the given noise (no plan) plays any step count the audit's own bounds allow
    out = run_audit(
        mode="poisson", mechanism="p3gm", mixing_order=20, class_size=20, samples_per_class=1200, sigma_x=1.0, trials=4
    )
    assert out["steps"] == 1200
