"""How fast AIM's refit between rounds converges: the refit of chosen rounds of a wa_churn release, taken as the
release made it (model, potentials, measurements), re-run with mirror descent (``pgm.Model.fit``, what the release
uses) and with accelerated mirror descent (mbi's ``UniversalAcceleratedMethod`` without line search, in numpy on the
same model), each for a few step counts, printing the loss reached and the seconds.

    python -m benchmarks.studies.aim_refit --data /tmp/aim-data/wa_churn --eps 10 --rounds 30 55 63

The rounds run as the release runs them (TEST seed, reproducible, not private) until the last asked round's refit;
nothing is released. Accelerated mirror descent: y = (1 - t) x + t z on the unit simplex, u -= g(y) / (N L t),
z = the marginals of u, x = (1 - t) x + t z, t from Nesterov's sequence; ``restart``: t starts again where the loss
at z rose (a function-value restart), and the best z's potentials are kept. Both report the loss at the marginals of
the potentials they end with (the model the next round would use).
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import sys
import time

import numpy as np


def loss_of(model, measurements, mu) -> tuple[float, dict]:
    """The refit's loss and its gradient at marginals ``mu`` (``pgm.Model.fit``'s objective)."""
    loss, grad = 0.0, {k: np.zeros(model._shape(k)) for k in model.cliques}
    for c, home, y, std in model._route(measurements):
        m = mu[home] if c == home else mu[home].sum(axis=model._axes_out(c, home))
        diff = (m - y) / std
        loss += 0.5 * float(np.vdot(diff, diff))
        grad[home] = grad[home] + (diff / std).reshape(model._within(c, home))
    return loss, grad


def accelerated(model, measurements, steps: int, restart: bool) -> float:
    """Loss at the potentials kept after ``steps`` accelerated steps from the model's current potentials."""
    total, lip = model.total, model.lipschitz(measurements)

    def unit(u):
        return {c: v / total for c, v in model._marginals(model._calibrate(u), model.cliques).items()}

    def loss_at(p):
        return loss_of(model, measurements, {c: v * total for c, v in p.items()})

    u = model.theta
    z = unit(u)
    x, t, last = dict(z), -1.0, loss_at(z)[0]
    best = last
    for _ in range(steps):
        t = 1.0 if t < 0 else 2.0 / (1.0 + math.sqrt(1.0 + 4.0 / t**2))
        _, g = loss_at({c: (1 - t) * x[c] + t * z[c] for c in model.cliques})
        u = {c: u[c] - g[c] / (total * lip * t) for c in model.cliques}
        z = unit(u)
        x = {c: (1 - t) * x[c] + t * z[c] for c in model.cliques}
        now = loss_at(z)[0]
        best = min(best, now) if restart else now
        if restart and now > last:
            t, x = -1.0, dict(z)
        last = now
    return best


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default="data/wa_churn")
    p.add_argument("--eps", type=float, default=10.0)
    p.add_argument("--rounds", type=int, nargs="+", default=[30, 55, 63], help="refits to study (1: the first round's)")
    p.add_argument("--steps", type=int, nargs="+", default=[100, 300, 1000])
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    from benchmarks.studies.aim_rounds import aim_release
    from dpcda.mechanisms import pgm

    wanted, real_fit, seen = set(args.rounds), pgm.Model.fit, [0]
    print("| round | model cells | method | steps | loss | seconds |\n|---|---:|---|---:|---:|---:|")

    def fit(self, measurements, iters, tol=None):
        seen[0] += 1
        r = seen[0] - 1  # call 1 fits the one-way counts; call r + 1 is round r's refit
        if r in wanted:
            cells = self.cells
            for steps in args.steps:
                m = copy.deepcopy(self)
                t0 = time.perf_counter()
                real_fit(m, measurements, steps, None)
                loss = loss_of(m, measurements, m._marginals(m.beliefs(), m.cliques))[0]
                print(f"| {r} | {cells} | mirror descent | {steps} | {loss:.3f} | {time.perf_counter() - t0:.1f} |")
                for restart in (False, True):
                    t0 = time.perf_counter()
                    loss = accelerated(copy.deepcopy(self), measurements, steps, restart)
                    name = "accelerated, restarts" if restart else "accelerated"
                    print(f"| {r} | {cells} | {name} | {steps} | {loss:.3f} | {time.perf_counter() - t0:.1f} |")
            sys.stdout.flush()
            if r >= max(wanted):
                os._exit(0)
        return real_fit(self, measurements, iters, tol)

    pgm.Model.fit = fit
    aim_release(args.data, args.eps, args.seed)


if __name__ == "__main__":
    main()
