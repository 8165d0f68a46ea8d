"""Linear probe: closed-form ridge regression from a release's features to its released labels or label scores.

Numpy only. It sits beside the CNN in every evaluation report as a floor the CNN should reach: a linear map commutes
with mixing (seed 001, Sec. III-B: if Y_i = W X_i then the mean of l labels is W times the mean of l features) and
zero-mean noise on the targets leaves the least-squares solution unbiased, so a mixing release's signal reaches the
probe whatever its l. The targets are the released scores as released (no clipping), or one-hot hard labels. The
ridge strength is chosen on the same stratified hold-out of the SYNTHETIC rows that the CNN uses (squared error
against the released targets, a proper score for their mean), then the probe is refitted on every synthetic row.
The real test rows arrive already normalised as the release normalised its own rows (``evaluation.stage``).
"""

from __future__ import annotations

import time
from typing import Optional

import numpy as np

RIDGE_GRID = (1e-4, 1e-3, 1e-2, 1e-1, 1.0)  # times the mean eigenvalue of the centred Gram matrix


def released_targets(labels: np.ndarray, scores: Optional[np.ndarray], num_classes: int) -> np.ndarray:
    if scores is not None:
        return np.asarray(scores, np.float64)
    return np.eye(num_classes)[np.asarray(labels, np.int64)]


class _Moments:
    """Sums of x, t, x x^T and x t^T over a set of rows: the whole ridge fit from one pass over the features."""

    def __init__(self, x: np.ndarray, t: np.ndarray, block: int = 8192):
        d, k = x.shape[1], t.shape[1]
        self.n, self.sx, self.st = len(x), np.zeros(d), np.zeros(k)
        self.xx, self.xt = np.zeros((d, d)), np.zeros((d, k))
        for i in range(0, len(x), block):
            xb, tb = np.asarray(x[i : i + block], np.float64), t[i : i + block]
            self.sx += xb.sum(axis=0)
            self.st += tb.sum(axis=0)
            self.xx += xb.T @ xb
            self.xt += xb.T @ tb

    def minus(self, other: "_Moments") -> "_Moments":
        out = object.__new__(_Moments)
        out.n, out.sx, out.st = self.n - other.n, self.sx - other.sx, self.st - other.st
        out.xx, out.xt = self.xx - other.xx, self.xt - other.xt
        return out

    def fit(self, lams) -> list[tuple[np.ndarray, np.ndarray]]:
        """(W, b) for each ridge strength in ``lams`` (relative to the mean eigenvalue), intercept unpenalised."""
        mx, mt = self.sx / self.n, self.st / self.n
        gram = self.xx - self.n * np.outer(mx, mx)
        cross = self.xt - self.n * np.outer(mx, mt)
        evals, evecs = np.linalg.eigh(gram)
        evals = np.maximum(evals, 0.0)
        proj = evecs.T @ cross
        scale = max(float(evals.mean()), 1e-12)
        out = []
        for lam in lams:
            w = evecs @ (proj / (evals + lam * scale)[:, None])
            out.append((w, mt - mx @ w))
        return out


def fit_ridge(x: np.ndarray, t: np.ndarray, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """(W, b) of ridge regression from ``x`` to ``t`` at relative strength ``lam``."""
    return _Moments(x, np.asarray(t, np.float64)).fit([lam])[0]


def select_ridge(x: np.ndarray, t: np.ndarray, val_idx: Optional[np.ndarray] = None) -> dict:
    """The ridge strength chosen on the synthetic hold-out ``val_idx`` (squared error to its targets; None: the middle
    of ``RIDGE_GRID``) and the fit at that strength on every row (``whole``: (W, b), the probe)."""
    t0 = time.time()
    x = np.asarray(x, np.float32)
    lams = RIDGE_GRID
    val_mse = []
    whole = _Moments(x, t)
    if val_idx is not None and len(val_idx):
        xv, tv = np.asarray(x[val_idx], np.float64), t[val_idx]
        for w, b in whole.minus(_Moments(xv, tv)).fit(lams):
            val_mse.append(float(((xv @ w + b - tv) ** 2).sum(axis=1).mean()))
        lam = lams[int(np.argmin(val_mse))]
    else:
        lam = lams[len(lams) // 2]
    ((w, b),) = whole.fit([lam])
    return {"ridge": lam, "ridge_grid": list(lams), "val_mse": val_mse, "whole": (w, b), "seconds": time.time() - t0}


def linear_probe(
    train_x: np.ndarray,
    train_y: np.ndarray,
    test_x: np.ndarray,
    test_y: np.ndarray,
    *,
    num_classes: int,
    scores: Optional[np.ndarray] = None,
    val_idx: Optional[np.ndarray] = None,
    selected: Optional[dict] = None,
) -> dict:
    """Accuracy on (test_x, test_y) of ridge regression fitted to the release's targets; argmax of the prediction.

    ``scores`` (rows, K): the released label scores (else one-hot ``train_y``). ``val_idx``: the synthetic hold-out
    that picks the ridge strength (None: the middle of ``RIDGE_GRID``). ``selected``: ``select_ridge``'s answer for
    these rows and targets, when the caller has it already."""
    t0 = time.time()
    if selected is None:
        selected = select_ridge(train_x, released_targets(train_y, scores, num_classes), val_idx)
    w, b = selected["whole"]
    pred = (np.asarray(test_x, np.float64) @ w + b).argmax(axis=1)
    test_y = np.asarray(test_y, np.int64)
    return {
        "accuracy": float((pred == test_y).mean()) if len(test_y) else float("nan"),
        "method": "ridge regression, closed form, to the released "
        + ("label scores as released" if scores is not None else "labels (one-hot)"),
        "ridge": selected["ridge"],
        "ridge_grid": selected["ridge_grid"],
        "val_mse": selected["val_mse"],
        "seconds": selected["seconds"] + time.time() - t0,  # the fit's time, wherever it ran, and the test's
    }
