"""The z-score and clip every z-scoring mechanism applies to its records (Algorithm 1, 2-6), the checks on the
statistics it uses, and the public statistics a user may give."""

from __future__ import annotations

import json

import numpy as np

from dpcda.mechanisms.base import PlanError
from dpcda.privacy.events import CLIP_MARGIN
from dpcda.storage.paths import open_file

MAX_Z_REACH = 1e12
NORMALIZATION_FILE = "normalization.json"  # what a z-scored release writes beside its parts (normalization_record)


def load_public_stats(path: str, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """(mean, std) from a JSON file {"mean": [d numbers], "std": [d numbers]}; PlanError naming the problem."""
    where = f"normalization_file {path}"
    try:
        with open_file(path) as fh:
            data = json.loads(fh.read())
    except (OSError, ValueError) as err:
        kind = "not valid JSON" if isinstance(err, ValueError) else "cannot be read"
        raise PlanError(f"{where}: {kind} ({type(err).__name__})") from None
    if not isinstance(data, dict):
        raise PlanError(f"{where}: must hold an object with 'mean' and 'std'")
    return checked_public_stats(data.get("mean", []), data.get("std", []), dim, where)


def checked_public_stats(mean, std, dim: int, where: str) -> tuple[np.ndarray, np.ndarray]:
    """float64 (mean, std), each of shape (d,), mean finite and std positive and finite; PlanError otherwise."""
    out = []
    for name, values in (("mean", mean), ("std", std)):
        try:
            arr = np.asarray(values, np.float64)
        except (TypeError, ValueError):
            raise PlanError(f"{where}: '{name}' must be a list of numbers") from None
        if arr.shape != (dim,):
            raise PlanError(f"{where}: '{name}' must be a flat list of {dim} numbers, found shape {list(arr.shape)}")
        out.append(arr)
    mean, std = out
    if not np.all(np.isfinite(mean)) or not np.all(np.isfinite(std)) or not np.all(std > 0):
        raise PlanError(f"{where}: mean must be finite and std positive and finite")
    return mean, std


def check_statistics(mean: np.ndarray, std: np.ndarray, bounds: tuple[float, float], clip: float) -> None:
    """Statistics that would make the z-score overflow (or are not finite) are refused before any row is mixed."""
    lo, hi = bounds
    if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(std)) and np.all(std > 0)):
        raise PlanError("normalization: the statistics are not finite positive numbers; nothing was released")
    reach = (hi - lo + np.abs(np.asarray(mean, np.float64) - (lo + hi) / 2)) / np.asarray(std, np.float64)
    if not np.all(reach < MAX_Z_REACH):
        raise PlanError(
            f"normalization: a std is below 1e-12 of feature_bounds [{lo:g}, {hi:g}] (z-scores near "
            f"1e12 would leave nothing but their signs after the clip); nothing was released"
        )


def _normalized64(
    features: np.ndarray, mean: np.ndarray, std: np.ndarray, clip: float, bounds: tuple[float, float]
) -> np.ndarray:
    z = (np.clip(np.asarray(features, np.float64), *bounds) - np.asarray(mean, np.float64)) / np.asarray(
        std, np.float64
    )
    norms = np.linalg.norm(z, axis=1, keepdims=True)
    z *= np.minimum(1.0, clip * (1.0 - CLIP_MARGIN) / np.maximum(norms, np.finfo(np.float64).tiny))
    return z


def _check_clipped(rows: np.ndarray, clip: float) -> None:
    if rows.size and np.linalg.norm(np.asarray(rows, np.float64), axis=1).max() > clip * (1.0 - CLIP_MARGIN / 2):
        raise AssertionError("clip: a row's norm exceeds the clip margin after rounding")  # never expected


def normalization_record(plan) -> dict:
    """What ``normalization.json`` holds: the statistics and clip the released rows were normalised with."""
    return {
        "mean": plan.mean.tolist(),
        "std": plan.std.tolist(),
        "clip": plan.clip,
        "feature_bounds": list(plan.bounds),
        "method": plan.normalization_method,
    }


def normalize(
    features: np.ndarray, mean: np.ndarray, std: np.ndarray, clip: float, bounds: tuple[float, float]
) -> np.ndarray:
    """float32 rows z-scored with the plan's statistics, each clipped to L2 norm ``clip (1 - CLIP_MARGIN)``
    (Algorithm 1, 2-6); what the evaluation applies to real test rows.

    The margin absorbs float32 rounding and the mixer's float64 summation (``mechanisms.dpcda``): what leaves
    here has a norm below ``clip (1 - 2^-21)`` as computed in float64, which is checked.
    """
    out = _normalized64(features, mean, std, clip, bounds).astype(np.float32)
    _check_clipped(out, clip)
    return out


def normalize_into(
    out: np.ndarray,
    features: np.ndarray,
    mean: np.ndarray,
    std: np.ndarray,
    clip: float,
    bounds: tuple[float, float],
    rows_per_step: int = 4096,
) -> None:
    """``normalize`` in float64, written into ``out`` (the class's preallocated rows) a few thousand rows at a time."""
    for start in range(0, len(features), rows_per_step):
        part = _normalized64(features[start : start + rows_per_step], mean, std, clip, bounds)
        _check_clipped(part, clip)
        out[start : start + len(part)] = part
