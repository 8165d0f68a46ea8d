"""The same ``--seed`` gives the same rows and manifest as recorded at 507453d, for every mechanism (tests.golden).

A manifest field may differ only where ``expected`` says so, with its reason."""

from __future__ import annotations

import copy
import json
import math

import pytest

from dpcda.mechanisms import p3gm, registry
from dpcda.pipeline.manifest import SECRET_KEY_CAVEAT, SEED_KEY_CAVEAT, TEST_SEED_CAVEAT
from dpcda.privacy import noise
from tests import golden
from tests.conftest import ROOT

RECORDED = json.loads((ROOT / "tests" / "recorded" / "golden_rows.json").read_text())


def expected(case: str, recorded: dict) -> dict:
    """The recorded manifest with the changes made since 507453d, each named here with its reason."""
    m = copy.deepcopy(recorded)
    p = m["privacy"]
    # every case is a --seed release: anyone who knows the seed rebuilds every draw, so it is not private
    assert p["end_to_end_dp"] is True and p["caveats"][0] == SECRET_KEY_CAVEAT
    p["end_to_end_dp"] = False
    p["caveats"][0] = SEED_KEY_CAVEAT
    assert p["caveats"][-1].startswith("TEST SEED:")
    p["caveats"][-1] = TEST_SEED_CAVEAT
    assert "words" not in p["noise"]  # the manifest now says where the noise words were computed
    p["noise"]["words"] = noise.WORDS
    if case.startswith("dpcda"):  # the rows per class are stated: equal (T/K, image releases' default), per class
        mech = m["mechanism"]
        assert "class_rows" not in mech and "rows_per_class" not in mech
        mech["class_rows"] = "equal"
        mech["rows_per_class"] = [mech["samples_per_class"]] * mech["num_classes"]
    if not case.startswith("dpcda"):  # each mechanism states how its events compose (not dpcda's classes)
        assert p["composition"].startswith("parallel over classes")
        p["composition"] = registry.get(m["mechanism"]["name"]).composition
    if case == "p3gm":  # p3gm states its own label caveat; it carried local perturbation's "released once"
        assert "every record is released once" in p["caveats"][1]
        p["caveats"][1] = registry.get("p3gm").label_caveat()
        # the DP-SGD section states the per-record position check the fit passed (its norms now in a fixed order)
        sgd = m["mechanism"]["dp_sgd"]
        assert "per_record_check" not in sgd
        sgd["per_record_check"] = p3gm.SGD_ROW_CHECK
    return m


# randproj's sensitivity gain is the projection's spectral norm from numpy (LAPACK's SVD), whose last bit differs
# between CPUs (2.4753226347234905 recorded on an Intel Xeon, 2.47532263472349 on an AMD EPYC: one ulp); sigma_x is
# calibrated from it. These fields compare to 1e-13 relative in that case; the rows still compare bit for bit.
LAPACK_FIELDS = {"projection_norm", "gain", "sigma_x"}


def _differences(recorded, now, path=(), loose=False):
    if isinstance(recorded, dict) and isinstance(now, dict):
        for key in sorted(set(recorded) | set(now)):
            if key not in recorded or key not in now:
                yield (*path, key)
            else:
                yield from _differences(recorded[key], now[key], (*path, key), loose)
    elif isinstance(recorded, list) and isinstance(now, list) and len(recorded) == len(now):
        for i, (a, b) in enumerate(zip(recorded, now)):
            yield from _differences(a, b, (*path, i), loose)
    elif loose and path and path[-1] in LAPACK_FIELDS and isinstance(recorded, float) and isinstance(now, float):
        if not math.isclose(recorded, now, rel_tol=1e-13):
            yield path
    elif recorded != now:
        yield path


def test_only_the_lapack_fields_of_randproj_compare_loosely():
    rec = {"mechanism": {"projection_norm": 2.4753226347234905, "clip": 1.0}, "events": [{"gain": 1.0}]}
    now = {"mechanism": {"projection_norm": 2.47532263472349, "clip": 1.0}, "events": [{"gain": 1.0 + 1e-15}]}
    assert list(_differences(rec, now, loose=True)) == []
    assert list(_differences(rec, now)) == [("events", 0, "gain"), ("mechanism", "projection_norm")]
    now["mechanism"]["clip"] = 1.0 + 1e-15  # not a LAPACK field: exact
    now["events"][0]["gain"] = 1.001  # beyond the tolerance
    assert list(_differences(rec, now, loose=True)) == [("events", 0, "gain"), ("mechanism", "clip")]


def test_every_mechanism_has_a_recording():
    assert set(RECORDED) == set(golden.CASES)


@pytest.mark.parametrize("case", sorted(golden.CASES))
def test_release_matches_its_recording(case, tmp_path):
    now = golden.fingerprint(golden.run_case(case, str(ROOT), str(tmp_path)))
    assert now["rows"] == RECORDED[case]["rows"], f"{case}: the released rows changed"
    changed = list(_differences(expected(case, RECORDED[case]["manifest"]), now["manifest"], loose=case == "randproj"))
    assert not changed, f"{case}: manifest fields changed: {changed}"
