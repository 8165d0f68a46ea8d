"""Every plan, ``dpcda account`` and audit calibration gives the events, sigmas and epsilons recorded at 8830665
(tests.plan_record; the marginals plans re-recorded when marginals stopped drawing a class histogram): however plans
are organised, no privacy number moves, not even in its last bit."""

from __future__ import annotations

import json

import pytest

from tests import plan_record
from tests.conftest import ROOT

RECORDED = json.loads((ROOT / "tests" / "recorded" / "plans.json").read_text())


def test_every_case_has_a_recording():
    assert set(RECORDED["plans"]) == set(plan_record.CASES)
    assert set(RECORDED["account"]) == set(plan_record.ACCOUNT)
    assert set(RECORDED["audit"]) == set(plan_record.AUDIT)


@pytest.mark.parametrize("name", sorted(plan_record.CASES))
def test_a_plan_spends_what_it_spent(name):
    assert plan_record.plan_case(name) == RECORDED["plans"][name]


@pytest.mark.parametrize("name", sorted(plan_record.ACCOUNT))
def test_account_calibrates_what_it_calibrated(name):
    assert plan_record.account_case(name) == RECORDED["account"][name]


@pytest.mark.parametrize("name", sorted(plan_record.AUDIT))
def test_the_audit_calibrates_what_it_calibrated(name):
    assert plan_record.audit_case(name) == RECORDED["audit"][name]
