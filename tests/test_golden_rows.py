"""The same ``--seed`` gives the same rows and manifest as recorded at 507453d, for every mechanism (tests.golden).

A manifest field may differ only where a change says so here, with its reason (``CHANGED``)."""

from __future__ import annotations

import json

import pytest

from tests import golden
from tests.conftest import ROOT

RECORDED = json.loads((ROOT / "tests" / "recorded" / "golden_rows.json").read_text())
# (case or "*", path in the manifest) -> why it differs from the recording
CHANGED: dict = {
    ("*", ("privacy", "end_to_end_dp")): "a --seed release is not private: end_to_end_dp false (issue: seeds)",
    ("*", ("privacy", "caveats")): "the TEST SEED caveat says the epsilon is the mechanism's, not the release's",
    ("p3gm", ("privacy", "caveats")): "p3gm states its own label caveat; it carried local perturbation's false 'every "
    "record is released once' (bad-input campaign 2026-11-26, #2)",
}


def _differences(recorded, now, path=()):
    if isinstance(recorded, dict) and isinstance(now, dict):
        for key in sorted(set(recorded) | set(now)):
            if key not in recorded or key not in now:
                yield (*path, key)
            else:
                yield from _differences(recorded[key], now[key], (*path, key))
    elif recorded != now:
        yield path


def test_every_mechanism_has_a_recording():
    assert set(RECORDED) == set(golden.CASES)


@pytest.mark.parametrize("case", sorted(golden.CASES))
def test_release_matches_its_recording(case, tmp_path):
    now = golden.fingerprint(golden.run_case(case, str(ROOT), str(tmp_path)))
    assert now["rows"] == RECORDED[case]["rows"], f"{case}: the released rows changed"
    changed = [
        p for p in _differences(RECORDED[case]["manifest"], now["manifest"]) if (case, p) not in CHANGED
        and ("*", p) not in CHANGED
    ]  # fmt: skip
    assert not changed, f"{case}: manifest fields changed: {changed}"
