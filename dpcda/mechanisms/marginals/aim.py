"""AIM's selection (McKenna, Mullins, Sheldon, Miklau 2022): adaptive rounds under a zCDP filter (``privacy.aim``)."""

from __future__ import annotations

import itertools
import logging
import math
from fractions import Fraction

import numpy as np

from dpcda.mechanisms import pgm
from dpcda.mechanisms.base import PlanError
from dpcda.mechanisms.marginals.counting import MarginalCounter
from dpcda.mechanisms.marginals.estimation import warm_start
from dpcda.mechanisms.marginals.plan import AIM_MAX_MODEL_SIZE, SCORE_BITS, MarginalsPlan, Measurements
from dpcda.privacy.aim import gaussian_rho, selection_rho
from dpcda.privacy.noise import NoiseStream
from dpcda.progress import track

log = logging.getLogger(__name__)


AIM_ROUND_ITERS = 1000  # at most this many accelerated steps in a refit between AIM rounds (AIM's 1000 steps)

AIM_ROUND_TOL = 1.0  # ... stopping once the loss falls by at most one unit (one cell by one std) per 50 steps, twice,

AIM_WATCH = 0.05  # ... and the picked clique's counts moved by at most 5 % of the annealing bound per 50 steps, twice


def aim_candidates(columns: int) -> dict:
    """AIM's candidates and weights for the workload of every pair of columns (the label's pairs among them): the
    workload's downward closure (every pair, every column), a clique weighted by how many columns it shares with the
    workload's cliques (AIM's ``compile_workload``: a pair 2 (d - 1), a column d - 1). Cliques larger than pairs are
    not candidates (the combiner counts one- and two-way marginals; the workload is two-way)."""
    workload = list(itertools.combinations(range(columns), 2))
    closure = [(i,) for i in range(columns)] + workload
    return {cl: sum(len(set(cl) & set(w)) for w in workload) for cl in closure}


def aim_scores(exact: dict, estimated: dict, weights: dict, std: float) -> dict:
    """Clique -> integer score in units of 2^-SCORE_BITS: AIM's w_r (||M_r(D) - M_r(p_hat)||_1 - sqrt(2/pi) sigma n_r),
    the model's counts and the bias rounded to the unit first (post-processing of DP outputs and public numbers), so a
    record moves a score by at most w_r units of 2^SCORE_BITS: the sensitivity is max w_r * 2^SCORE_BITS."""
    unit = float(1 << SCORE_BITS)
    scores = {}
    for cl, w in weights.items():
        x = np.asarray(exact[cl], np.int64) << SCORE_BITS
        est = np.asarray(estimated[cl], np.float64)
        if not np.isfinite(est).all():  # the model is DP: refusing on it says nothing about the records
            raise PlanError(f"marginals: the fitted model's counts on {cl} are not finite; nothing was published")
        # clipped to [0, 2^52] units (post-processing), so every cell's |x - xhat| is exact in int64 whatever the model
        xhat = np.rint(np.clip(est * unit, 0.0, float(1 << 52))).astype(np.int64)
        bias = int(round(math.sqrt(2.0 / math.pi) * std * x.size * unit))
        scores[cl] = int(w) * (_exact_sum(np.abs(x - xhat)) - bias)
    return scores


def _exact_sum(v: np.ndarray) -> int:
    """The sum of non-negative int64 values below 2^63, exactly: their high and low 32 bits summed apart (each sum
    stays below 2^63 for fewer than 2^31 values), then joined in Python's integers."""
    v = v.ravel()
    return (int((v >> 32).sum()) << 32) + int((v & 0xFFFFFFFF).sum())


def measure_aim(counter: MarginalCounter, acc: np.ndarray, plan: MarginalsPlan, key: bytes) -> Measurements:
    """AIM (McKenna, Mullins, Sheldon, Miklau 2022, private-pgm's examples/aim.py): the noisy one-way counts, then
    rounds until the budget is spent (``privacy.aim.AimSchedule``, a zCDP filter): each picks a clique among the
    candidates whose model fits ``size_limit`` (the cap scaled by the share of rho spent so far; a clique the model
    already covers always fits) with the exact exponential mechanism on ``aim_scores``, measures its counts with
    Gaussian noise, refits the model (``pgm.Model.fit_accelerated``: accelerated mirror descent in numpy, warm-started
    from the last model's potentials, up to ``AIM_ROUND_ITERS`` steps, until the loss stalls (``AIM_ROUND_TOL``) and the
    picked marginal has stopped moving (``AIM_WATCH`` of the annealing bound): the anneal test below needs a converged
    refit; a short one barely moves when sigma is small, and anneals on that) and anneals (halves sigma, doubles
    epsilon) when the refit moved that marginal by at most sqrt(2/pi) sigma n_r in L1. Only noisy counts and the picks
    leave; the exact counts feed the scores only."""
    from dpcda.privacy.aim import AimSchedule
    from dpcda.privacy.exponential import Bits, exponential_mechanism

    dom = plan.domain
    n = len(dom.sizes)
    names = dom.names
    sched = AimSchedule(plan.rho, n)
    one_way = [
        NoiseStream(key, "marginals", "aim-one-way", i).gaussian(counter.marginal(acc, (i,)), sched.one_way_std)
        for i in range(n)
    ]
    ms = [((i,), np.asarray(y, np.float64), sched.one_way_std) for i, y in enumerate(one_way)]
    model = pgm.Model(dom.sizes, [(i,) for i in range(n)], pgm.min_variance_total(ms))
    model.fit_accelerated(ms, AIM_ROUND_ITERS, AIM_ROUND_TOL)
    weights = aim_candidates(n)
    max_weight = max(weights.values())
    cap = plan.max_model_size or AIM_MAX_MODEL_SIZE
    bits = Bits(NoiseStream(key, "marginals", "aim-select"))
    picked, two_way, stds, rounds = [], [], [], []
    cells_of, cells = None, {}  # the model's cliques -> candidate -> cells of the model with it (public: the picks)
    bar = track("marginals AIM rounds, share of rho spent", 100, unit="%")  # the schedule's spending is public
    while not sched.done:
        rnd = sched.next_round()
        size_limit = cap * float(sched.filter.spent / sched.filter.cap)
        covered = {sub for cl in model.cliques for r in (1, 2) for sub in itertools.combinations(cl, r)}
        if tuple(model.cliques) != cells_of:  # the sizes change only when a new clique enters the model
            cells_of, cells = tuple(model.cliques), {}
        for cl in weights:
            if cl not in cells and cl not in covered:
                cells[cl] = pgm.model_cells(dom.sizes, [*model.cliques, cl])
        small = [cl for cl in weights if cl in covered or cells[cl] <= size_limit]
        est = {cl: model.marginal(cl) for cl in small}
        scores = aim_scores(
            {cl: counter.marginal(acc, cl) for cl in small},
            est,
            {cl: weights[cl] for cl in small},
            rnd.std,
        )
        i = exponential_mechanism(
            [scores[cl] for cl in small],
            epsilon=rnd.epsilon,
            sensitivity=Fraction(max_weight << SCORE_BITS),
            bits=bits,
        )
        cl = small[i]
        cl_names = tuple(names[j] for j in cl)
        y = NoiseStream(key, "marginals", "aim-round", len(rounds)).gaussian(counter.marginal(acc, cl), rnd.std)
        picked.append(cl)
        two_way.append(y)
        stds.append(rnd.std)
        ms.append((cl, np.asarray(y, np.float64), rnd.std))
        before = est[cl]
        threshold = math.sqrt(2.0 / math.pi) * rnd.std * before.size
        model = pgm.Model(dom.sizes, [*model.cliques, cl], pgm.min_variance_total(ms), model.theta)
        model.fit_accelerated(ms, AIM_ROUND_ITERS, AIM_ROUND_TOL, watch=(cl, AIM_WATCH * threshold))
        after = model.marginal(cl)
        anneal = bool(np.abs(after - before).sum() <= threshold)
        if anneal and not rnd.last:
            sched.anneal()
        rounds.append(
            {
                "clique": list(cl_names),
                "epsilon": float(rnd.epsilon),
                "noise_std": rnd.std,
                "rho": float(rnd.rho),
                "candidates": len(small),
                "fit_steps": model.steps,
                "annealed": anneal and not rnd.last,
            }
        )
        log.info(
            "stage=marginals aim round=%d clique=%s std=%.3g anneal=%s steps=%d cells=%d",
            len(rounds),
            cl_names,
            rnd.std,
            anneal,
            model.steps,
            model.cells,
        )
        bar.set(100 * float(sched.filter.spent / sched.filter.cap), round=len(rounds))
    bar.close()
    record = {
        "planned_rounds": sched.planned_rounds,
        "rounds_run": len(rounds),
        "annealing_steps": sched.annealed,
        "one_way_noise_std": sched.one_way_std,
        "rho_cap": plan.rho,
        "rho_spent": float(sched.filter.spent),
        "rho_one_way": float(n * gaussian_rho(sched.one_way_std)),
        "rho_selection": float(sum(selection_rho(r.epsilon) for r in sched.rounds)),
        "rho_measurement": float(sum(gaussian_rho(r.std) for r in sched.rounds)),
        "max_model_size_cells": cap,
        "round_iterations": AIM_ROUND_ITERS,
        "round_tolerance": AIM_ROUND_TOL,
        "round_watch": AIM_WATCH,
        "rounds": rounds,
    }
    return Measurements(one_way, picked, two_way, sched.one_way_std, stds, warm_start(model, dom), record)
