"""How much of the top-K variance a DP-PCA basis keeps on Fashion-MNIST, by its share of epsilon.

    python -m benchmarks.studies.pca_spectrum                          # K = 10 (p3gm's d'), eps 1 and 10, shares 5-40 %
    python -m benchmarks.studies.pca_spectrum --k 32 --eps 10 --shares 0.1

The covariance DP-PCA releases is the sum of x x^T over the rows, each z-scored and clipped to L2 norm 1
(``mechanisms.plan.normalize``, here with the exact mean and std: a diagnostic of the basis, not a release), summed
exactly by the product's ``mechanisms.dppca.CovarianceCombiner``. Its noise is the one the plan calibrates for the
share (``privacy.calibration.calibrate_gaussian`` with ``privacy.dp_stats.covariance_sensitivity``, add/remove, the
accountant's delta of a release at 1e-5), drawn by the product's ``privacy.dp_stats.dp_covariance`` from a public
noise stream. For each (eps,
share) the table gives the noise's spectral norm, the K-th eigenvalue of the exact sum beside it, and the fraction of
the exact top-K variance that the noisy top-K basis captures, over ``--draws`` noise draws (1.0: the exact basis).
"""

from __future__ import annotations

import argparse

import numpy as np

from dpcda.mechanisms.dppca import CovarianceCombiner, CovarianceSum
from dpcda.mechanisms.plan import normalize
from dpcda.pipeline.prepare import FASHION_MNIST_DIR, load_fashion_mnist
from dpcda.privacy import dp_stats
from dpcda.privacy.accounting import accountant_delta
from dpcda.privacy.calibration import calibrate_gaussian
from dpcda.privacy.noise import NoiseStream, public_key


def covariance_sum(x: np.ndarray) -> CovarianceSum:
    """The exact covariance sum of the rows z-scored (exact statistics) and clipped to norm 1, as DP-PCA sums it."""
    rows = normalize(x, x.mean(0), np.maximum(x.std(0), 1e-3), 1.0, (float(x.min()), float(x.max())))
    comb = CovarianceCombiner(1.0)
    return comb.add(comb.create(), rows)


def x_units(acc: CovarianceSum) -> np.ndarray:
    return acc.sum_qq * 2.0 ** (-2 * dp_stats.COV_QUANTUM_BITS)


def noise_std(dim: int, epsilon: float, delta: float) -> float:
    """The per-entry noise std of the released covariance sum, in the quantized units DP-PCA draws it in."""
    ev = calibrate_gaussian(
        "poisson",
        name="pca_covariance",
        sensitivity=dp_stats.covariance_sensitivity(dim, "poisson"),
        target_epsilon=epsilon,
        delta=accountant_delta(delta),
    )
    return ev.noise_std


def captured(acc: CovarianceSum, std: float, k: int, stream: NoiseStream) -> tuple[float, float]:
    """(fraction of the exact top-k variance the noisy top-k basis captures, the noise's spectral norm, x units)."""
    cov = x_units(acc)
    noisy = dp_stats.dp_covariance(acc.sum_qq, 1.0, noise_std=std, stream=stream)
    _, vecs = np.linalg.eigh(noisy)
    basis = vecs[:, -k:]
    exact = np.linalg.eigvalsh(cov)[::-1][:k].sum()
    return float(np.trace(basis.T @ cov @ basis) / exact), float(np.abs(np.linalg.eigvalsh(noisy - cov)).max())


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--eps", type=float, nargs="+", default=[1.0, 10.0])
    ap.add_argument("--shares", type=float, nargs="+", default=[0.05, 0.1, 0.2, 0.3, 0.4])
    ap.add_argument("--draws", type=int, default=3)
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--limit", type=int, default=None, help="first N training rows")
    ap.add_argument("--source", default=FASHION_MNIST_DIR)
    args = ap.parse_args(argv)
    x, _ = load_fashion_mnist("train", args.source)
    x = x[: args.limit].astype(np.float64)
    acc = covariance_sum(x)
    ev = np.linalg.eigvalsh(x_units(acc))[::-1]
    print(f"Fashion-MNIST, {len(x)} rows, d = {x.shape[1]}; top eigenvalues of the clipped covariance sum:")
    print("  " + ", ".join(f"{v:.0f}" for v in ev[: max(args.k, 12)]))
    print()
    print(f"| eps | share | noise std | noise spectral norm | eigenvalue {args.k} | top-{args.k} variance captured |")
    print("|---:|---:|---:|---:|---:|---|")
    for eps in args.eps:
        for share in args.shares:
            std = noise_std(x.shape[1], share * eps, args.delta)
            runs = [
                captured(acc, std, args.k, NoiseStream(public_key("pca-spectrum", i), f"{eps:g}", f"{share:g}"))
                for i in range(args.draws)
            ]
            frac = ", ".join(f"{f:.3f}" for f, _ in runs)
            norm = np.mean([n for _, n in runs])
            std_x = std * 2.0 ** (-2 * dp_stats.COV_QUANTUM_BITS)
            print(f"| {eps:g} | {share:g} | {std_x:.1f} | {norm:.0f} | {ev[args.k - 1]:.0f} | {frac} |", flush=True)


if __name__ == "__main__":
    main()
