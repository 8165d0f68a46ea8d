"""The same ``--seed`` gives the same rows and manifest as recorded at 507453d, for every mechanism (tests.golden).

A manifest field may differ only where ``expected`` says so, with its reason."""

from __future__ import annotations

import copy
import json

import pytest

from dpcda.mechanisms import p3gm, registry
from dpcda.pipeline.manifest import SECRET_KEY_CAVEAT, SEED_KEY_CAVEAT, TEST_SEED_CAVEAT
from dpcda.privacy import noise
from dpcda.privacy.events import projection_gain
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
    # the input's file count is no longer stated: a writer that splits shards by size makes it follow the number of
    # records, a private count no guarantee covers
    assert m["input"].pop("files") == 2
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
    if case == "randproj":  # the gain is an upper bound on ||R||_2 with the same bits on every CPU (projection_gain)
        mech, events = m["mechanism"], p["events"]["per_class"][0]
        assert mech["projection_norm"] == events["gain"] == 2.4753226347234905  # LAPACK's estimate, Intel Xeon
        mech["projection_norm"] = events["gain"] = projection_gain(2.4753226347234905)
        assert mech["projection_norm"] == 2.475322723388672  # 3.6e-8 above: 20 significant bits, rounded up
        # calibrated at that gain: the noise multiplier, sigma_x and epsilon move in their 9th digit; the rows do not
        mech["noise_multiplier"] = 0.5392300017669335
        mech["sigma_x"] = events["sigma_x"] = 2.6695365530132085
        p["epsilon"] = 9.990745180705005
        p["components"]["perturbation"] = 9.960426325164871
        p["delta_breakdown"]["sampler"] = 9.041444661144293e-46
    return m


def _differences(recorded, now, path=()):
    if isinstance(recorded, dict) and isinstance(now, dict):
        for key in sorted(set(recorded) | set(now)):
            if key not in recorded or key not in now:
                yield (*path, key)
            else:
                yield from _differences(recorded[key], now[key], (*path, key))
    elif isinstance(recorded, list) and isinstance(now, list) and len(recorded) == len(now):
        for i, (a, b) in enumerate(zip(recorded, now)):
            yield from _differences(a, b, (*path, i))
    elif recorded != now:
        yield path


def test_every_mechanism_has_a_recording():
    assert set(RECORDED) == set(golden.CASES)


@pytest.mark.parametrize("case", sorted(golden.CASES))
def test_release_matches_its_recording(case, tmp_path):
    now = golden.fingerprint(golden.run_case(case, str(ROOT), str(tmp_path)))
    assert now["rows"] == RECORDED[case]["rows"], f"{case}: the released rows changed"
    changed = list(_differences(expected(case, RECORDED[case]["manifest"]), now["manifest"]))
    assert not changed, f"{case}: manifest fields changed: {changed}"
