"""How fast AIM's refit between rounds converges: the refit of chosen rounds of a wa_churn release, taken as the
release made it (model, potentials, measurements), re-run with mirror descent (``pgm.Model.fit``, mbi's step) and with
accelerated mirror descent with restarts (``pgm.Model.fit_accelerated``, what the release runs) for a few step
counts, printing the loss reached, the picked clique's distance (L1) from a long refit's marginal, and the seconds.

    python -m benchmarks.studies.aim_refit --data data/wa_churn --eps 10 --rounds 10 30 50

The rounds run as the release runs them (TEST seed, reproducible, not private) until the last asked round's refit;
nothing is released. Only public names of ``dpcda.mechanisms.pgm`` are used: ``Model`` (``fit``,
``fit_accelerated``, ``marginal``, ``cells``, ``loss``) and the measurements the release passes.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time

import numpy as np


def refits(model, measurements, steps: list, reference_steps: int, accelerated) -> list:
    """(method, steps, loss, L1 distance of the picked clique from the reference, seconds) for each method and step
    count, from copies of ``model``; the picked clique is the last measurement's. ``accelerated``:
    ``pgm.Model.fit_accelerated`` (the study replaces the class's to catch the release's refits)."""
    picked = tuple(sorted(measurements[-1][0]))
    ref = accelerated(copy.deepcopy(model), measurements, reference_steps).marginal(picked)
    methods = {"fit": type(model).fit, "fit_accelerated": accelerated}
    out = []
    for n in steps:
        for name, method in methods.items():
            m = copy.deepcopy(model)
            t0 = time.process_time()
            method(m, measurements, n)
            seconds = time.process_time() - t0
            out.append((name, n, m.loss, float(np.abs(m.marginal(picked) - ref).sum()), seconds))
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default="data/wa_churn")
    p.add_argument("--eps", type=float, default=10.0)
    p.add_argument("--rounds", type=int, nargs="+", default=[10, 30, 50], help="refits to study (1: the first round's)")
    p.add_argument("--steps", type=int, nargs="+", default=[100, 300, 1000])
    p.add_argument("--reference-steps", type=int, default=4000)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    from benchmarks.studies.aim_rounds import aim_release
    from dpcda.mechanisms import pgm

    wanted, real_fit, seen = set(args.rounds), pgm.Model.fit_accelerated, [0]
    print(
        "| round | model cells | method | steps | loss | picked clique's L1 from the reference | CPU s |\n"
        "|---|---:|---|---:|---:|---:|---:|"
    )

    def fit(self, measurements, iters, tol=None, watch=None):
        seen[0] += 1
        r = seen[0] - 1  # call 1 fits the one-way counts; call r + 1 is round r's refit
        if r in wanted:
            for name, n, loss, dist, seconds in refits(self, measurements, args.steps, args.reference_steps, real_fit):
                print(f"| {r} | {self.cells} | {name} | {n} | {loss:.3f} | {dist:.1f} | {seconds:.2f} |")
            sys.stdout.flush()
            if r >= max(wanted):
                os._exit(0)
        return real_fit(self, measurements, iters, tol, watch)

    pgm.Model.fit_accelerated = fit
    aim_release(args.data, args.eps, args.seed)


if __name__ == "__main__":
    main()
