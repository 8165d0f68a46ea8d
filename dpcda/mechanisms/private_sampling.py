"""Private sampling on Boolean tables (seed 002's Algorithm 1): a tool beside the release, not a release mechanism.

What it samples. The input is n records of p <= 20 bits (bit b is the cube coordinate x = 1 - 2b, so the Walsh
function of a set J is w_J = (-1)^(number of ones of the record in J)). The algorithm:
  1. draws a reduced space S of m points uniformly (with repetition) from the cube {0, 1}^p;
  2. forms the m x binom(p, <= d) Walsh matrix W of S and goes on only if its smallest singular value is at least
     sqrt(m) / (2 e^d) ("well conditioned"); otherwise the algorithm's output is "Failure". Failure depends on S
     only, never on the data, so drawing S again until it is well conditioned (at most ``MAX_ATTEMPTS`` times) is
     exactly Algorithm 1 conditioned on success: the conditional output distribution of neighbours keeps the
     theorem's ratio bound, because P[success] is the same for both;
  3. computes the data's Walsh coefficients of degree <= d, b_J = mean over records of w_J (exactly, as integers
     from a fast Walsh-Hadamard transform of the record histogram, then divided by n);
  4. LP (scipy's HiGHS): the smallest lambda in [0, 1] such that some h~ in [2 delta/m, (Delta - delta)/m]^S
     has W^T h~ = (1 - lambda) b + lambda W^T u_m, u_m the uniform density on S (seed 002, section 3.1);
  5. QP (DAQP, a dual active-set solver): h* = the point of {W^T h = (1 - lambda) b + lambda W^T u_m} inside
     [delta/m, Delta/m]^S closest to u_m in L2 (seed 002, section 3.2);
  6. draws k indices of S independently with probabilities h* and outputs those points as rows of bits.
Both programs run in the scaled variable g = m h (values of order 1). S is a sequence: a point drawn twice is two
indices, each with its own weight, and the output is the point of the drawn index (post-processing of the index).

What it spends. Theorem 4.1 (``privacy.feasibility``): pure eps-DP under replace-one with n public when
k <= eps (delta/Delta)^(3/2) e^(-d/2) binom(p, <= d)^(-1/4) sqrt(n) / (4 sqrt(2) m^(3/4)). Nothing goes through
``dp_accounting``: the guarantee is the theorem's, for this one output, and it composes with nothing else here.
The sampler checks the theorem from public quantities only (n, p, eps, k, d, m, delta, Delta) before it uses the
data (it has only checked that every value is 0 or 1), and refuses (``PrivateSamplingError``) unless the theorem
holds or the caller passes ``allow_not_dp=True``; then ``dp`` is False and the output must not be called private.

Randomness. S and the k draws come from ``privacy.noise.NoiseStream`` (ChaCha20 under the caller's key):
S from ("private-sampling", "reduced-space", attempt), the rows from ("private-sampling", "rows"). Index draws are
exact: h* is rounded to integer weights c_i = round(2^60 h*_i / sum h*) (each c_i >= 2^60 delta / m >= 2^40, as
delta >= m / 2^20 is required), and an exact uniform integer below sum c_i picks the index, so index i has
probability c_i / sum c_j exactly, within a relative 2^-40 of h*_i.

What the guarantee does not cover (``CAVEATS``, written to the CLI's sidecar):
  - the theorem is about the exact minimisers of step 4 and 5; HiGHS and DAQP solve them in floating point. The
    solution is checked (box, equality residual, and the QP's KKT conditions to ``TOLERANCE`` in the g scale) and
    clipped into [delta/m, Delta/m], but the effect of the remaining rounding on the ratio bound is not proven;
  - a solver failure (raised as an error) could depend on the data; the theorem says steps 4 and 5 are always
    feasible for a well-conditioned S, so a failure is a numerical event, not a property of the data;
  - the integer rounding of the weights changes each index probability by a relative 2^-40 at most (above).
Accuracy (Theorem 4.2) is never claimed here: for p <= 20 its range for m, up to 2^(p/4) <= 32, is empty.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np

from dpcda.privacy import feasibility
from dpcda.privacy.errors import DpcdaError
from dpcda.privacy.noise import NoiseStream

MAX_COLUMNS = 20
MAX_REDUCED_SPACE = 4096  # the QP's dense Hessian is m x m
MAX_WALSH = MAX_REDUCED_SPACE // feasibility.REDUCED_SPACE_FACTOR  # 512: the default m stays within MAX_REDUCED_SPACE
MAX_SYNTHETIC_SIZE = 10**7  # k rows: the sampler and the writer peak near 2 GB at p = 20 (bits_of is k x p int64)
MAX_ATTEMPTS = 64  # reduced spaces drawn before giving up on a well-conditioned one
WEIGHT_BITS = 60
TOLERANCE = 1e-7  # accepted residuals of the LP/QP solution, in the scaled variable g = m h (values in [delta, Delta])
LP_SOLVER = "scipy.optimize.linprog(method='highs') (HiGHS)"
QP_SOLVER = "daqp (dual active-set QP)"
SAMPLER = (
    f"index draws by exact uniform integers (rejection on ChaCha20 words) against integer weights "
    f"round(2^{WEIGHT_BITS} h*); reduced space uniform on the cube by the same exact sampler"
)
CAVEATS = (
    "Theorem 4.1 covers the exact LP/QP minimisers; the floating-point solutions (HiGHS, DAQP) are checked to a "
    f"tolerance of {TOLERANCE:g} (box, equalities, KKT) and clipped into [delta/m, Delta/m], but their rounding "
    "error is outside the proof",
    "a solver failure is reported as an error; whether it happens may depend on the data",
    f"index probabilities are integer weights within a relative 2^-40 of h* ({WEIGHT_BITS}-bit rounding)",
    "accuracy (Theorem 4.2) is not claimed: its range for m, up to 2^(p/4), is empty for p <= 20",
)


class PrivateSamplingError(DpcdaError):
    """A table the sampler cannot take, a refusal to sample without DP, or a failed run of Algorithm 1."""


@dataclass(frozen=True)
class SampleResult:
    rows: np.ndarray  # (k, p) uint8 bits, the synthetic table
    dp: bool  # Theorem 4.1 holds for (n, p, eps, k, d, m, delta, Delta)
    reason: str  # one line: why dp is what it is
    conditions: dict  # privacy.feasibility.conditions(...) for the run's parameters
    attempts: int  # reduced spaces drawn (data-independent: public)
    # PRIVATE diagnostic (computed from the data): the step-4 shrinkage. For tests only; never write it out.
    shrinkage: float = field(repr=False, default=math.nan)


# ---------------------------------------------------------------- Walsh functions


def walsh_masks(p: int, degree: int) -> np.ndarray:
    """int64 bit masks of the sets J with |J| <= degree, by size then value (J = {} first)."""
    masks = [sum(1 << j for j in js) for size in range(degree + 1) for js in itertools.combinations(range(p), size)]
    return np.array(sorted(masks, key=lambda m: (m.bit_count(), m)), dtype=np.int64)


def walsh_signs(codes: np.ndarray, masks: np.ndarray) -> np.ndarray:
    """(len(codes), len(masks)) float64: w_J(x) = (-1)^popcount(x & J), the cube point of a code x."""
    parity = np.bitwise_count(np.asarray(codes, np.int64)[:, None] & masks[None, :]) & 1
    return 1.0 - 2.0 * parity.astype(np.float64)


def walsh_sums(codes: np.ndarray, p: int, masks: np.ndarray) -> np.ndarray:
    """int64 sum over records of w_J, for each mask: an exact fast Walsh-Hadamard transform of the histogram."""
    h = np.bincount(np.asarray(codes, np.int64), minlength=1 << p).astype(np.int64)
    for j in range(p):
        h = h.reshape(-1, 2, 1 << j)
        a, b = h[:, 0, :].copy(), h[:, 1, :]
        h[:, 0, :] += b
        h[:, 1, :] = a - b
        h = h.reshape(-1)
    return h[masks]


def codes_of(bits: np.ndarray) -> np.ndarray:
    """int64 code sum_j bit_j 2^j of each row of 0/1 columns."""
    weights = np.int64(1) << np.arange(bits.shape[1], dtype=np.int64)
    return (np.asarray(bits, np.int64) * weights).sum(axis=1)


def bits_of(codes: np.ndarray, p: int) -> np.ndarray:
    return ((np.asarray(codes, np.int64)[:, None] >> np.arange(p, dtype=np.int64)) & 1).astype(np.uint8)


# ---------------------------------------------------------------- steps 2, 4 and 5


def well_conditioned(w: np.ndarray, degree: int) -> bool:
    """Step 2: smallest singular value of the m x l Walsh matrix >= sqrt(m) / (2 e^d), with a float margin."""
    m, l = w.shape
    if m < l:
        return False
    s = np.linalg.svd(w, compute_uv=False)
    threshold = math.sqrt(m) / (2 * math.exp(degree))
    return bool(s[-1] - threshold > 1e-10 * s[0])


def shrinkage(w: np.ndarray, b: np.ndarray, delta: float, big_delta: float) -> float:
    """Step 4 (LP): the smallest lambda with some g in [2 delta, Delta - delta]^m, W^T g = (1 - lam) m b + lam W^T 1."""
    from scipy.optimize import linprog

    m = w.shape[0]
    ones = w.sum(axis=0)  # W^T 1
    a_eq = np.hstack([(m * b - ones)[:, None], w.T])  # [lam, g]: W^T g + lam (m b - W^T 1) = m b
    res = linprog(
        np.r_[1.0, np.zeros(m)],
        A_eq=a_eq,
        b_eq=m * b,
        bounds=[(0.0, 1.0)] + [(2 * delta, big_delta - delta)] * m,
        method="highs",
        options={"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10},
    )
    if res.status != 0 or res.x is None:
        raise PrivateSamplingError(f"step 4 (LP, HiGHS) failed: {res.message.splitlines()[0]}")
    return float(np.clip(res.x[0], 0.0, 1.0))


def proximal_point(w: np.ndarray, target: np.ndarray, delta: float, big_delta: float) -> np.ndarray:
    """Step 5 (QP): g in [delta, Delta]^m with W^T g = target closest to 1 (g = m h), checked and clipped."""
    import daqp

    m, l = w.shape
    a = np.ascontiguousarray(w.T)
    upper = np.r_[np.full(m, big_delta), target]
    lower = np.r_[np.full(m, delta), target]
    sense = np.r_[np.zeros(m), np.full(l, 5)].astype(np.int32)  # 5: equality
    g, _, flag, info = daqp.solve(
        np.eye(m), -np.ones(m), a, upper, lower, sense, primal_tol=1e-11, iter_limit=100 * (m + l)
    )
    g = np.asarray(g, np.float64)
    if flag != 1 or not np.isfinite(g).all():
        raise PrivateSamplingError(f"step 5 (QP, DAQP) failed: exit flag {flag}")
    lam = np.asarray(info["lam"], np.float64)
    scale = max(1.0, float(np.abs(target).max()))
    checks = {
        "box": max(float((delta - g).max()), float((g - big_delta).max()), 0.0),
        "equalities": float(np.abs(a @ g - target).max()) / scale,
        "stationarity": float(np.abs(g - 1.0 + lam[:m] + w @ lam[m:]).max()),
        # a bound multiplier is non-zero only where its bound is active (complementary slackness)
        "slackness": float(np.abs(lam[:m] * np.minimum(g - delta, big_delta - g)).max()),
        # and has the sign of its bound: <= 0 at the lower bound, >= 0 at the upper one (DAQP's convention)
        "dual signs": float(
            np.where(g - delta <= big_delta - g, np.maximum(lam[:m], 0), np.maximum(-lam[:m], 0)).max()
        ),
    }
    bad = {k: v for k, v in checks.items() if not v <= TOLERANCE}
    if bad:
        raise PrivateSamplingError(f"step 5 (QP, DAQP): solution fails its check ({', '.join(sorted(bad))})")
    return np.clip(g, delta, big_delta)


def draw_indices(stream: NoiseStream, weights: np.ndarray, k: int) -> np.ndarray:
    """k independent indices with probabilities c_i / sum c, c_i = round(2^60 w_i / sum w): exact integer draws."""
    w = np.asarray(weights, np.float64)
    c = np.rint(w / w.sum() * 2.0**WEIGHT_BITS).astype(np.int64)
    if c.min() < 2**40:  # never with delta >= m / 2^20, which sample_boolean checks
        raise PrivateSamplingError("step 6: a weight is below 2^-20; use a larger delta")
    cum = np.cumsum(c)
    u = stream.uniform_int(int(cum[-1]), k)
    return np.searchsorted(cum, u, side="right")


# ---------------------------------------------------------------- the sampler


def check_table(bits) -> np.ndarray:
    """The table as a (n, p) uint8 array of 0/1 values; PrivateSamplingError names the first bad column and row."""
    x = np.asarray(bits)
    if x.ndim != 2:
        raise PrivateSamplingError(f"table: expected a 2-D array of 0/1 values, got {x.ndim} dimensions")
    n, p = x.shape
    if n == 0:
        raise PrivateSamplingError("table: no records")
    if not 1 <= p <= MAX_COLUMNS:
        raise PrivateSamplingError(f"table: {p} columns; private sampling here takes 1 to {MAX_COLUMNS}")
    if x.dtype == bool:
        return x.astype(np.uint8)
    if not (np.issubdtype(x.dtype, np.integer) or np.issubdtype(x.dtype, np.floating)):
        raise PrivateSamplingError(f"table: values must be 0/1 numbers, got dtype {x.dtype}")
    bad = ~((x == 0) | (x == 1))
    if bad.any():
        row, col = np.argwhere(bad)[0]
        raise PrivateSamplingError(f"table: column {col}, row {row}: a value that is not 0 or 1")
    return x.astype(np.uint8)


def sample_boolean(
    bits,
    *,
    epsilon: float,
    synthetic_size: int,
    key: bytes,
    degree: int = feasibility.DEFAULT_DEGREE,
    reduced_space: int | None = None,
    delta: float = feasibility.DEFAULT_DELTA,
    big_delta: float = feasibility.DEFAULT_BIG_DELTA,
    allow_not_dp: bool = False,
) -> SampleResult:
    """Algorithm 1 of seed 002 on a 0/1 table (n records, p <= 20 columns): k synthetic rows of bits.

    Refuses (``PrivateSamplingError``, message = the one-line reason) unless Theorem 4.1 holds for (n, p, epsilon,
    k, degree, m, delta, Delta), or ``allow_not_dp``; the result's ``dp`` says which. ``key`` is the run's noise key
    (``privacy.noise.fresh_key()``; ``key_from_test_seed`` for tests only). Bad parameters raise
    ``feasibility.FeasibilityError``.
    """
    if not 1 <= synthetic_size <= MAX_SYNTHETIC_SIZE:
        raise feasibility.FeasibilityError(
            f"synthetic_size must be in [1, {MAX_SYNTHETIC_SIZE:,}] for the sampler, got {synthetic_size}"
        )
    x = check_table(bits)
    n, p = x.shape
    count = int(feasibility.walsh_count(p, degree))
    if count > MAX_WALSH:
        raise feasibility.FeasibilityError(
            f"degree {degree}: {count} Walsh functions for p={p}; this sampler takes at most {MAX_WALSH}"
        )
    cond = feasibility.conditions(
        p,
        epsilon,
        synthetic_size,
        records=n,
        reduced_space=reduced_space,
        degree=degree,
        delta=delta,
        big_delta=big_delta,
    )
    m = cond["reduced_space"]
    if not count <= m <= MAX_REDUCED_SPACE:
        raise feasibility.FeasibilityError(
            f"reduced_space must be in [{count}, {MAX_REDUCED_SPACE}] for p={p}, d={degree}, got {m}"
        )
    if cond["delta"] * 2.0**20 < m:  # keeps every integer weight of step 6 above 2^40 (g >= delta, sum g = m)
        raise feasibility.FeasibilityError(
            f"delta must be at least m / 2^20 = {m / 2.0**20:.3g} for m={m}, got {delta:g}"
        )
    if not feasibility.algorithm_well_defined(delta, big_delta):
        raise feasibility.FeasibilityError(
            f"big_delta: Algorithm 1 needs 2 delta <= 1 <= Delta - delta, got delta={delta:g}, Delta={big_delta:g}"
        )
    if not cond["dp"] and not allow_not_dp:
        raise PrivateSamplingError(
            f"{cond['reason']}; refusing to sample (--allow-not-dp samples anyway, marked dp: false)"
        )

    masks = walsh_masks(p, degree)
    for attempt in range(1, MAX_ATTEMPTS + 1):  # data-independent: S only
        s = NoiseStream(key, "private-sampling", "reduced-space", attempt).uniform_int(1 << p, m)
        w = walsh_signs(s, masks)
        if well_conditioned(w, degree):
            break
    else:
        raise PrivateSamplingError(
            f"reduced_space {m}: no well-conditioned reduced space in {MAX_ATTEMPTS} draws (Failure); use a larger m"
        )

    b = walsh_sums(codes_of(x), p, masks) / n  # exact integers / n
    lam = shrinkage(w, b, cond["delta"], cond["big_delta"])
    target = (1.0 - lam) * m * b + lam * w.sum(axis=0)
    g = proximal_point(w, target, cond["delta"], cond["big_delta"])
    idx = draw_indices(NoiseStream(key, "private-sampling", "rows"), g, cond["synthetic_size"])
    return SampleResult(
        rows=bits_of(s[idx], p),
        dp=bool(cond["dp"]),
        reason=cond["reason"],
        conditions=cond,
        attempts=attempt,
        shrinkage=lam,
    )
