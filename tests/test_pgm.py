"""The numpy graphical model of AIM's rounds (``mechanisms.pgm``) against mbi and against brute force."""

import itertools

import numpy as np
import pytest

from dpcda.mechanisms import marginals as mg
from dpcda.mechanisms import pgm


@pytest.fixture(scope="module")
def mbi():
    return mg._mbi()


def _random_cliques(rng, d):
    k = int(rng.integers(0, 2 * d))
    pairs = [tuple(sorted(rng.choice(d, size=2, replace=False).tolist())) for _ in range(k)]
    triples = [tuple(sorted(rng.choice(d, size=3, replace=False).tolist())) for _ in range(int(rng.integers(0, 2)))]
    return pairs + triples + [(i,) for i in range(d)]


def test_model_cells_is_mbis_hypothetical_model_size(mbi):
    rng = np.random.default_rng(1)
    trees = 0
    for k in range(400):
        d = int(rng.integers(3, 10))
        sizes = [int(s) for s in rng.integers(2, 7, size=d)]
        cliques = _random_cliques(rng, d)
        if rng.random() < 0.2:  # a spanning tree: mbi eliminates it leaves first, not greedily
            cliques = [(min(i, int(p)), max(i, int(p))) for i in range(1, d) for p in [rng.integers(0, i)]]
            trees += 1
        names = [str(i) for i in range(d)]
        named = [tuple(names[i] for i in c) for c in cliques]
        mb = mbi.junction_tree.hypothetical_model_size(mbi.Domain(names, sizes), named)
        assert pgm.model_cells(sizes, cliques) == round(mb * (1 << 17)), (sizes, cliques)
        if k % 8 == 0:  # a fitted model's own size is the same figure
            assert pgm.Model(sizes, cliques, 1.0).cells == pgm.model_cells(sizes, cliques), (sizes, cliques)
    assert trees > 40


def _measurements(rng, sizes, cliques, std=3.0):
    truth = rng.dirichlet(np.full(int(np.prod(sizes)), 0.3)).reshape(sizes) * 2000
    out = []
    for c in [(i,) for i in range(len(sizes))] + cliques:
        m = truth.sum(axis=tuple(a for a in range(len(sizes)) if a not in c))
        out.append((c, m + rng.normal(0, std, m.shape), std))
    return out


@pytest.mark.parametrize(
    "sizes, cliques",
    [
        ((3, 4, 2, 5, 3, 2), [(0, 1), (1, 2), (0, 2), (2, 3), (3, 4), (4, 5), (1, 4)]),  # loops: cliques of three
        ((4, 3, 5, 2, 2), [(0, 1), (3, 4)]),  # a forest
        ((2, 3, 4), [(0, 1, 2), (1, 2)]),  # one clique holds all
    ],
)
def test_fit_matches_mbis_mirror_descent(mbi, sizes, cliques):
    rng = np.random.default_rng(7)
    meas = _measurements(rng, sizes, cliques)
    names = [str(i) for i in range(len(sizes))]
    ms = [mbi.LinearMeasurement(np.ravel(y), tuple(names[i] for i in c), stddev=s) for c, y, s in meas]
    ref = mbi.estimation.MirrorDescent().estimate(mbi.Domain(names, list(sizes)), ms, iters=200)
    total = pgm.min_variance_total(meas)
    assert total == pytest.approx(float(ref.total), rel=1e-12)
    model = pgm.Model(sizes, [c for c, _, _ in meas], total).fit(meas, 200)
    for a, b in itertools.combinations(range(len(sizes)), 2):
        want = np.asarray(ref.project((names[a], names[b])).datavector(flatten=False))
        np.testing.assert_allclose(model.marginal((a, b)), want, atol=1e-4 * total)
    # the fit lowers mbi's loss from the start (zero potentials: the uniform table)
    start = pgm.Model(sizes, [c for c, _, _ in meas], total)
    assert _loss(model, meas) < 0.5 * _loss(start, meas)


def _loss(model, meas):
    return sum(0.5 * float(np.sum(((model.marginal(c) - y) / s) ** 2)) for c, y, s in meas if len(c) <= 2)


def _brute(model):
    """The model's full table: exp(sum of potentials) over every cell, scaled to the total."""
    d = len(model.sizes)
    logp = np.zeros(model.sizes)
    for c, v in model.theta.items():
        logp = logp + v.reshape(tuple(model.sizes[a] if a in c else 1 for a in range(d)))
    p = np.exp(logp - logp.max())
    return p / p.sum() * model.total


@pytest.mark.parametrize(
    "sizes, cliques",
    [
        ((3, 2, 4, 2, 3, 2, 2), [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 6), (0, 2), (2, 4)]),
        ((3, 2, 4, 2, 3), [(0, 1), (3, 4)]),
        ((2, 2, 3, 2, 3, 2), [(0, 1, 2), (2, 3), (3, 4), (4, 5), (1, 5)]),
    ],
)
def test_pair_marginals_no_clique_holds_equal_brute_force(sizes, cliques):
    rng = np.random.default_rng(3)
    model = pgm.Model(sizes, cliques + [(i,) for i in range(len(sizes))], 500.0)
    model.theta = {c: rng.normal(0, 1.5, v.shape) for c, v in model.theta.items()}
    model._beliefs = None
    full = _brute(model)
    held = 0
    for a, b in itertools.combinations(range(len(sizes)), 2):
        want = full.sum(axis=tuple(x for x in range(len(sizes)) if x not in (a, b)))
        np.testing.assert_allclose(model.marginal((a, b)), want, rtol=1e-9, atol=1e-9)
        held += any({a, b} <= set(k) for k in model.maximal)
    assert held < len(list(itertools.combinations(range(len(sizes)), 2)))  # some pairs went along the tree
    for i in range(len(sizes)):
        np.testing.assert_allclose(model.marginal((i,)), full.sum(axis=tuple(x for x in range(len(sizes)) if x != i)))


def test_warm_start_carries_the_distribution_to_a_larger_model():
    rng = np.random.default_rng(5)
    sizes = (3, 4, 2, 3)
    small = pgm.Model(sizes, [(0, 1), (2,), (3,)], 100.0)
    small.theta = {c: rng.normal(0, 1, v.shape) for c, v in small.theta.items()}
    small._beliefs = None
    big = pgm.Model(sizes, [*small.cliques, (1, 2), (2, 3)], 100.0, small.theta)
    assert set(big.cliques) == {(0, 1), (1, 2), (2, 3)}
    np.testing.assert_allclose(_brute(big), _brute(small), rtol=1e-12)


def test_warm_start_is_mbis_potentials(mbi):
    rng = np.random.default_rng(2)
    dom = mg.Domain(("a", "b", "c"), (2, 3, 4), 4)
    model = pgm.Model(dom.sizes, [(0, 1), (1, 2)], 50.0)
    model.theta = {c: rng.normal(0, 1, v.shape) for c, v in model.theta.items()}
    warm = mg.warm_start(model, dom)
    # mbi's columns are named by index (``estimation.columns``: its draws must not follow the process's hash seed)
    assert set(warm.cliques) == {(0, 1), (1, 2)}
    np.testing.assert_array_equal(np.asarray(warm[(1, 2)].datavector(flatten=False)), model.theta[(1, 2)])


def test_short_fits_take_mbis_step_size(mbi):
    """A measurement is routed to the smallest clique holding it, as mbi routes it, so the step 2 / (L total) and a
    short (50-step) fit are mbi's, not only the fixed point a long fit converges to."""
    rng = np.random.default_rng(11)
    sizes = (3, 200, 2, 5)
    cliques = [(0, 1), (0, 2), (2, 3), (1, 3)]
    meas = _measurements(rng, sizes, cliques)
    names = [str(i) for i in range(len(sizes))]
    ms = [mbi.LinearMeasurement(np.ravel(y), tuple(names[i] for i in c), stddev=s) for c, y, s in meas]
    dom = mbi.Domain(names, list(sizes))
    model = pgm.Model(sizes, [c for c, _, _ in meas], pgm.min_variance_total(meas))
    assert model.lipschitz(meas) == pytest.approx(mbi.marginal_loss.from_linear_measurements(ms, dom).lipschitz)
    ref = mbi.estimation.MirrorDescent().estimate(dom, ms, iters=50)
    model.fit(meas, 50)
    for c in cliques:
        want = np.asarray(ref.project(tuple(names[i] for i in c)).datavector(flatten=False))
        np.testing.assert_allclose(model.marginal(c), want, rtol=1e-6, atol=1e-6)


def test_message_order_is_fixed_by_the_cliques():
    """HUGIN's order (collect to each tree's smallest clique, then distribute) covers every edge both ways, a
    clique sends up only after hearing from its children, and does not depend on set or hash order."""
    sizes = (2,) * 9
    cliques = [(0, 1), (1, 2), (2, 3), (1, 4), (4, 5), (6, 7), (7, 8), (0, 2)]
    a = pgm.Model(sizes, cliques, 10.0)
    b = pgm.Model(sizes, list(reversed(cliques)), 10.0)
    assert a._order == b._order
    edges = {frozenset(e) for e in a._tree.edges}
    assert {frozenset(m) for m in a._order} == edges and len(a._order) == 2 * len(edges)
    for n, (i, j) in enumerate(a._order):  # every message into i but j's was sent before i sends to j
        before = set(a._order[:n])
        assert all((k, i) in before for k in a._tree.neighbors(i) if k != j)


def test_a_refit_to_tolerance_reaches_a_precise_measurement_that_fifty_steps_do_not():
    """AIM anneals when a refit moved the picked marginal by at most sqrt(2/pi) sigma n_r in L1. With a small sigma
    the safe step 2 / (L total) is small, and 50 steps barely move the model: the test would anneal on an
    unconverged fit. Fitted to tolerance, the model comes within that bound of the new measurement."""
    rng = np.random.default_rng(4)
    sizes = (2, 30, 4)
    truth = np.zeros(sizes)
    truth[0, :15, :], truth[1, 15:, :] = 1.0, 1.0  # column 0 decides which half of column 1
    truth = truth * rng.uniform(0.5, 1.5, sizes) * 20
    one_way = [((i,), truth.sum(axis=tuple(a for a in range(3) if a != i)) + rng.normal(0, 30, sizes[i]), 30.0)
               for i in range(3)]  # fmt: skip
    pair = truth.sum(axis=2)
    meas = one_way + [((0, 1), pair + rng.normal(0, 0.5, pair.shape), 0.5)]
    bound = np.sqrt(2 / np.pi) * 0.5 * pair.size
    base = pgm.Model(sizes, [c for c, _, _ in one_way], pgm.min_variance_total(one_way)).fit(one_way, 1000, 1e-4)
    errors = {}
    for name, iters, tol in (("short", 50, None), ("converged", 1000, 1e-4)):
        m = pgm.Model(sizes, [c for c, _, _ in meas], pgm.min_variance_total(meas), base.theta).fit(meas, iters, tol)
        errors[name] = np.abs(m.marginal((0, 1)) - meas[-1][1]).sum()
    assert errors["converged"] <= bound < errors["short"], (errors, bound)
    assert base.steps < 1000  # the one-way fit stopped on the tolerance


def test_linear_space_calibration_is_the_log_space_one_and_falls_back_where_it_underflows():
    """Every maximal clique's probabilities equal the log-space recursion's (random models, spread potentials) and
    brute force; potentials 800 apart on two cliques that favour opposite values of their shared column (each
    clique's exp underflows where the other's mass is) leave nothing in linear space, and the log-space recursion
    gives the right answer there."""
    rng = np.random.default_rng(8)
    for trial in range(30):
        d = int(rng.integers(3, 6))
        sizes = tuple(int(s) for s in rng.integers(2, 5, d))
        model = pgm.Model(sizes, _random_cliques(rng, d), 1000.0)
        model.theta = {c: rng.normal(0, 1 + 10 * (trial % 3), v.shape) for c, v in model.theta.items()}
        lin, log = model._calibrate(model.theta), model._calibrate_log(model._log_potentials(model.theta))
        for k in model.maximal:
            np.testing.assert_allclose(lin[k], log[k], rtol=1e-9, atol=1e-300)
        model._beliefs = None
        full = _brute(model)
        for i in range(d):
            np.testing.assert_allclose(model.marginal((i,)), full.sum(axis=tuple(x for x in range(d) if x != i)))
    model = pgm.Model((2, 2, 2), [(0, 1), (1, 2)], 10.0)
    model.theta = {(0, 1): np.array([[800.0, 0.0], [800.0, 0.0]]), (1, 2): np.array([[0.0, 0.0], [800.0, 800.0]])}
    model._beliefs = None
    np.testing.assert_allclose(model.marginal((1,)), [5.0, 5.0])
    np.testing.assert_allclose(model.marginal((0, 2)), np.full((2, 2), 2.5))
    # one separator cell's message underflows to 0 (column 1 = 1 is e^-800 likely): HUGIN's division skips it
    model.theta = {(0, 1): rng.normal(0, 1, (2, 2)), (1, 2): np.array([[0.3, 0.0], [-800.0, -800.0]])}
    model._beliefs = None
    assert model._calibrate(model.theta) is not None
    full = _brute(model)
    for c in ((0,), (1,), (2,), (0, 1), (1, 2), (0, 2)):
        want = full.sum(axis=tuple(x for x in range(3) if x not in c))
        np.testing.assert_allclose(model.marginal(c), want, rtol=1e-12, atol=1e-300)


def test_a_joint_that_linear_space_holds_only_in_denormals_is_calibrated_in_log_space():
    """Two cliques whose largest potentials (744 above the rest) sit on different values of their shared column: every
    cell of the joint is 744 below the sum of the two maxima, so in linear space each product of the cliques' factors
    is a denormal float (about 1e-323, a few bits of precision) and the old test (mass > 0) took that for a result:
    600 and 400 rows where the joint has 583.5 and 416.5. Calibration now falls back to the log-space recursion once a
    message or a clique keeps less than ``pgm.TINY`` of its mass."""
    model = pgm.Model((2, 3, 2), [(0, 1), (1, 2)], 1000.0)
    model.theta = {
        (0, 1): np.array([[744.0, 0.0, 0.0], [744.3, 0.0, 0.0]]),
        (1, 2): np.array([[0.0, 0.5], [744.0, 744.2], [0.0, 0.0]]),
    }
    model._beliefs = None
    want = _brute(model)
    assert abs(want.sum(axis=(0, 2))[0] - 583.5) < 0.1
    for c in ((0,), (1,), (2,), (0, 1), (1, 2)):
        np.testing.assert_allclose(
            model.marginal(c), want.sum(axis=tuple(x for x in range(3) if x not in c)), rtol=1e-9
        )
