"""The marginals mechanism's row count and nulls: the count is the fitted model's total (post-processing, no class
histogram is spent), within its noise of a known truth, and both selections keep a nullable column's nulls."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpcda.mechanisms import marginals as mg
from dpcda.mechanisms.plan import release_budget
from dpcda.privacy.aim import calibrate as calibrate_aim
from dpcda.privacy.events import AimEvent
from dpcda.privacy.marginals import calibrate as calibrate_mst
from dpcda.privacy.noise import key_from_test_seed
from dpcda.schemas.config import load_config
from tests.test_tables import SCHEMA, make_table

SIGMAS = 4.0  # |rows - N| <= 4 sd + 1/2: a false failure has probability below 1e-4 per release (Gaussian noise)


def _cfg(**kw):
    return load_config(None, {"input": "x", "output": "o/r", "mechanism": "marginals", "table": SCHEMA, **kw})


@pytest.mark.parametrize("selection", ["mst", "mst-label", "aim"])
def test_marginals_spends_no_class_histogram(selection):
    """The budget planner gives marginals the whole target: no class histogram share is planned (its 1 % went back
    to the mechanism), while the mixing mechanisms keep theirs."""
    core = _cfg(epsilon=1.0, marginals_selection=selection).core
    plan = release_budget(core.privacy, core.params, 7)
    assert plan.get("class_histogram") is None and not plan.adaptive
    dpcda = load_config(None, {"input": "x", "output": "o/r", "epsilon": 1.0, "mode": "poisson", "num_classes": 2}).core
    assert release_budget(dpcda.privacy, dpcda.params, 7).get("class_histogram") is not None


def _codes(n: int, seed: int) -> tuple[mg.Domain, np.ndarray]:
    """n rows of four dependent columns and a label (the truth: every marginal sums to n)."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    a = np.where(y == 1, rng.integers(0, 3, n), rng.integers(2, 6, n))
    b = (a + rng.integers(0, 2, n)) % 4
    c = rng.integers(0, 3, n)
    d = np.where(rng.random(n) < 0.1, 5, rng.integers(0, 5, n))  # 10 % of a nullable column's null code (5)
    return mg.Domain(("a", "b", "c", "d", "y"), (6, 4, 3, 6, 2), 5), np.stack([a, b, c, d, y], 1).astype(np.int64)


@pytest.mark.parametrize("selection", ["mst-label", "aim"])
def test_the_row_count_is_the_fitted_models_total_within_its_noise(selection, monkeypatch):
    """On a generated table of known size, the released count (the model's total, rounded) is within 4 sd of the
    truth, sd the std of the minimum-variance combination of the two-way counts' sums alone (mbi's total also
    weighs in the one-way counts, so its sd is at most that)."""
    monkeypatch.setattr(mg.aim, "AIM_ROUND_ITERS", 200)
    n = 3000
    dom, codes = _codes(n, seed=3)
    counter = mg.MarginalCounter(dom)
    acc = counter.add(counter.create(), codes)
    c = len(dom.sizes)
    if selection == "aim":
        ev = calibrate_aim(target_epsilon=1.0, delta=1e-6, one_way=c)
        assert isinstance(ev, AimEvent)
    else:
        ev = calibrate_mst(target_epsilon=1.0, delta=1e-6, one_way=c, rounds=c - 1, two_way=2 * (c - 1))
    plan = mg.MarginalsPlan(selection=selection, domain=dom, iterations=100, rho=ev.rho, event=ev)
    measured = mg.measure(counter, acc, plan, key_from_test_seed(21))
    model = mg.fit(measured, plan)
    # mbi's columns named by index (estimation.columns): its sampler's set order is then the same in every process
    # (test_a_seeded_marginals_release_gives_the_same_rows_whatever_the_string_hash_seed, slow, plays two)
    assert tuple(model.domain.attributes) == tuple(range(c))
    rows = mg.rows_of_total(float(model.total))
    small = mg.compressed_domain(dom, measured.mapping)
    inv = sum(1.0 / (s**2 * math.prod(small.sizes[i] for i in cl)) for cl, s in zip(measured.pairs, measured.stds))
    sd = math.sqrt(1.0 / inv)
    assert abs(rows - n) <= SIGMAS * sd + 0.5, (rows, n, sd)
    assert sd < 0.03 * n  # the bound itself is tight enough to mean something


@pytest.fixture(scope="module")
def null_releases():
    """A 3000-row table whose nullable columns hold 10 % and 14 % nulls, released at eps 1 by both selections."""
    import dpcda

    table = make_table(3000, seed=1)
    out = {}
    for selection in ("mst-label", "aim"):
        out[selection] = dpcda.release(
            table,
            epsilon=1.0,
            mechanism="marginals",
            schema=SCHEMA,
            seed=5,
            marginals_selection=selection,
            marginals_bins=4,
            marginals_iters=100,
        )
    return table, out


@pytest.mark.parametrize("selection", ["mst-label", "aim"])
def test_both_selections_keep_the_nulls_and_state_the_count(null_releases, selection):
    """Every nullable column's null rate is within the one-way tolerance (0.03) of the real one; the manifest states
    the count as the model's total (post-processing) and spends the whole target on the marginals."""
    table, releases = null_releases
    rel = releases[selection]
    out = rel.table
    for name in ("charges", "paperless"):
        real = table.column(name).null_count / table.num_rows
        assert real > 0.05
        assert abs(out.column(name).null_count / out.num_rows - real) <= 0.03, (name, selection)
    mech, privacy = rel.manifest["mechanism"], rel.manifest["privacy"]
    assert mech["row_count"] == "model_total" and mech["dataset_size_dp"] is None
    assert mech["samples_total"] == out.num_rows == round(mech["fit"]["total"])
    assert set(privacy["components"]) == {"marginals"}
    assert 1.0 * (1 - 2e-3) <= privacy["components"]["marginals"] <= privacy["epsilon"] == 1.0
    assert "class_histogram" not in privacy["noise"]["grids"]


_SEEDED_RELEASE = """
import hashlib, sys
import pyarrow as pa
import dpcda
from tests.test_table_rules import SCHEMA, churn_like
plain = {k: v for k, v in SCHEMA.items() if k != "rules"}  # ten columns: parents of two and more in mbi's sampler
with dpcda.release(churn_like(400, seed=2), epsilon=5, mechanism="marginals", schema=plain, seed=3,
                   marginals_selection="mst-label", marginals_iters=50) as rel:
    table = rel.table
sink = pa.BufferOutputStream()
with pa.ipc.new_stream(sink, table.schema) as w:
    w.write_table(table)
sys.stdout.write(hashlib.sha256(sink.getvalue().to_pybytes()).hexdigest())
"""


@pytest.mark.slow
def test_a_seeded_marginals_release_gives_the_same_rows_whatever_the_string_hash_seed():
    """mbi's sampler walks sets of column names; Python salts string hashes per process (PYTHONHASHSEED), so a model
    whose columns were named by their names drew other rows in another process from the same seed. Slow: two
    processes that import JAX and mbi and release 400 rows each (86 s on a loaded 2-core machine)."""
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _SEEDED_RELEASE],
            cwd=ROOT,
            env={**os.environ, "PYTHONHASHSEED": str(h), "PYTHONPATH": str(ROOT)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for h in (1, 2)
    ]
    out = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in out]
    assert out[0][0] == out[1][0] and len(out[0][0]) == 64
