"""DP-PCA projection for mixing (``--projection dp-pca:K``): a DP basis of the clipped rows, mixing in K dimensions.

The covariance sum_i x_i x_i^T of the z-scored, clipped rows is released once under DP (``privacy.dp_stats``:
quantized exact integer sums, a symmetric Gaussian noise matrix, its own share of the budget: a Gaussian event
composed with the rest). Its top K eigenvectors V (d x K, orthonormal) are post-processing of that release. Each
record is then mixed as V^T x (norm <= c still: V has orthonormal columns), the noise is drawn in K dimensions, and
each released row is mapped back, V z (post-processing). The d - K discarded directions carry no noise at all, which
is what lifts utility; the price is the covariance's share of the budget and whatever signal lies outside V.

Exactness. Quantized rows hold integers below 2^16 + sqrt(d)/2 in float64, so a block's q^T q (a BLAS product) sums
integer products below 2^33 over at most ``BLOCK_ROWS`` rows: every partial sum stays below 2^53 and is exact in any
order; blocks are added in int64.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional

import numpy as np

from dpcda.mechanisms import rowwise
from dpcda.mechanisms.base import PlanError
from dpcda.privacy import dp_stats
from dpcda.privacy.events import CLIP_MARGIN
from dpcda.privacy.noise import NoiseStream, public_key

PROJECT_BLOCK = 1024  # rows per projection product (a fixed shape: mechanisms.rowwise)
BLOCK_ROWS = 1 << 16  # rows per exact float64 product: 2^16 rows x 2^32 per product < 2^53
MAX_ROWS = dp_stats.COV_MAX_SUM >> (2 * dp_stats.COV_QUANTUM_BITS)  # rows whose sums stay below 2^62 in int64


@dataclasses.dataclass(frozen=True)
class PcaPlan:
    """The DP-PCA stage of a release: K components, the covariance's noise std (in units of (clip / 2^16)^2, as its
    sums are: ``privacy.dp_stats.dp_covariance``) and its share of epsilon."""

    components: int
    noise_std: float
    share: float

    def section(self) -> dict:
        """The manifest's ``projection`` of a mixing release."""
        return {
            "method": "dp-pca",
            "components": self.components,
            "covariance_noise_std": self.noise_std,
            "epsilon_share": self.share,
        }


@dataclasses.dataclass
class CovarianceSum:
    """Accumulator: the exact int64 sum of q q^T over the rows seen (None before the first row)."""

    sum_qq: Optional[np.ndarray] = None
    rows: int = 0


class CovarianceCombiner:
    """Beam-free combiner of exact quantized covariance sums (rows already z-scored and clipped to ``clip``)."""

    def __init__(self, clip: float):
        self.clip = float(clip)

    def create(self) -> CovarianceSum:
        return CovarianceSum()

    def add(self, acc: CovarianceSum, x: np.ndarray) -> CovarianceSum:
        if acc.rows + len(x) >= MAX_ROWS:
            raise PlanError(f"projection: more than {MAX_ROWS} rows; the exact covariance sums would overflow")
        total = acc.sum_qq
        for start in range(0, len(x), BLOCK_ROWS):
            q = dp_stats.covariance_quantize(x[start : start + BLOCK_ROWS], self.clip)
            part = (q.T @ q).astype(np.int64)  # exact: see the module docstring
            total = part if total is None else total + part
        return CovarianceSum(total, acc.rows + len(x))

    @staticmethod
    def merge(accs) -> CovarianceSum:
        out = CovarianceSum()
        for a in accs:
            if a.sum_qq is not None:
                out.sum_qq = a.sum_qq.copy() if out.sum_qq is None else out.sum_qq + a.sum_qq
            out.rows += a.rows
        if out.rows >= MAX_ROWS:  # int64 would wrap past 2^63 (the plan refuses this on public counts first)
            raise PlanError(f"projection: more than {MAX_ROWS} rows; the exact covariance sums would overflow")
        return out


def dp_basis(acc: CovarianceSum, *, dim: int, components: int, clip: float, noise_std: float, key: bytes) -> np.ndarray:
    """V (d x K, float64, orthonormal columns): the top-K eigenvectors of the DP covariance (stream ('pca',))."""
    sum_qq = acc.sum_qq if acc.sum_qq is not None else np.zeros((dim, dim), np.int64)
    cov = dp_stats.dp_covariance(sum_qq, clip, noise_std=noise_std, stream=NoiseStream(key, "pca"))
    _, vecs = np.linalg.eigh(cov)  # ascending eigenvalues
    basis = vecs[:, ::-1][:, :components]
    q, _ = np.linalg.qr(basis)  # exactly orthonormal to float precision; same span
    return np.ascontiguousarray(q * np.sign(np.diag(q.T @ basis))[None, :])


def project_rows(x: np.ndarray, basis: np.ndarray, clip: float) -> np.ndarray:
    """V^T x per row, each row's norm kept at most ``clip (1 - CLIP_MARGIN)`` (float error of the product scaled
    away): the mixer's sensitivity argument (``mechanisms.dpcda``) then holds for the projected rows unchanged.

    Computed on zero-padded blocks of exactly ``PROJECT_BLOCK`` rows (``mechanisms.rowwise``), so a record's
    projection has the same bits whatever the other rows and their number; the position invariance of that block
    shape is checked once per basis shape (``RowDependenceError`` if it fails)."""
    x = np.asarray(x, np.float64)
    basis = np.asarray(basis, np.float64)
    check_projection(x.shape[1], basis.shape[1])
    out = np.empty((len(x), basis.shape[1]), np.float64)
    with rowwise.one_blas_thread():
        for start, stop in rowwise.blocks(len(x), PROJECT_BLOCK):
            block = rowwise.pad_rows(x[start:stop], PROJECT_BLOCK)
            out[start:stop] = _project_block(block, basis, clip)[0][: stop - start]
    return out


def _project_block(xb: np.ndarray, basis: np.ndarray, clip: float) -> tuple[np.ndarray]:
    z = xb @ basis
    limit = clip * (1.0 - CLIP_MARGIN)
    norms = np.linalg.norm(z, axis=1)
    over = norms > limit
    if np.any(over):
        z[over] *= (limit / norms[over])[:, None]
    return (z,)


@functools.lru_cache(maxsize=None)
def check_projection(dim: int, components: int) -> None:
    """Position invariance of ``_project_block`` at this shape (on one BLAS thread, as ``project_rows`` runs it), on
    public random rows and a public random basis: ``rowwise.TRIALS`` blocks. K >= d is refused first, in one line
    (the trials on a d x K basis would take minutes for nothing: the plan refuses it anyway)."""
    if not 0 < components < dim:
        raise PlanError(
            f"projection: K={components} must be below the feature dimension d={dim} (dp-pca:K, or p3gm_latent_dim)"
        )
    stream = NoiseStream(public_key("rowwise-check", 0), "projection", dim, components)
    u = stream.uniform((PROJECT_BLOCK + components) * dim) - 0.5
    xb, basis = u[: PROJECT_BLOCK * dim].reshape(PROJECT_BLOCK, dim), u[PROJECT_BLOCK * dim :].reshape(dim, components)
    clip = float(np.median(np.linalg.norm(xb @ basis, axis=1)))  # about half the rows take the scaling branch
    trials = rowwise.rolled_trials([xb])
    with rowwise.one_blas_thread():
        rowwise.check_position_invariance(
            lambda a: _project_block(a, basis, clip), trials, what=f"projection onto {components} of {dim} dimensions"
        )
