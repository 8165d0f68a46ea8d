"""The exponential mechanism, sampled exactly from the noise module's uniform bits.

Relation-agnostic: it is given scores and their sensitivity under the caller's relation (the marginals mechanism:
add/remove one record, its pair scores move by at most 1).

The mechanism: candidate i with probability proportional to exp(epsilon q_i / (2 sensitivity)). It is epsilon-DP and,
being epsilon-bounded range, epsilon^2/8-zCDP (Cesar and Rogers 2021), which is the event the release accounts
(``privacy.events.MarginalsEvent``: a ``ZCDpEvent`` per round).

Exact sampling, no floating point. Scores, epsilon and the sensitivity are exact rationals (``Fraction``); with
gamma_i = epsilon (max_j q_j - q_i) / (2 sensitivity) >= 0, a candidate i is proposed uniformly (exact rejection on
random bits) and accepted with probability exp(-gamma_i); proposals repeat until one is accepted. A round accepts i
with probability exp(-gamma_i) / m, so the accepted candidate has exactly the mechanism's distribution; the best
candidate is always accepted, so a draw needs at most m proposals on average. exp(-gamma) is decided by Canonne,
Kamath and Steinke's Bernoulli(exp(-gamma)) sampler ("The discrete Gaussian for differential privacy", 2020,
Algorithm 1), which needs only Bernoulli(p) for rational p; that one compares the uniform bits with p lazily, 64 bits
at a time, until they differ (exact). No float is computed, so nothing is added to delta. What is not covered: the
running time depends on the scores (as every sampler's time does; the product claims no timing-channel protection).
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Sequence

import numpy as np

from dpcda.privacy import noise
from dpcda.privacy.noise import NoiseStream

_BUFFER_WORDS = 256
_NO_COPY = "Bits cannot be copied or pickled: a copy would hand out the same words again"


class Bits:
    """Uniform 64-bit words read from a ``NoiseStream`` a block at a time (the stream's order, deterministic).

    Like its stream, it cannot be copied or pickled, nor read in a process forked after it was made: its buffered
    words would be handed out twice."""

    def __init__(self, stream: NoiseStream):
        self.stream = stream
        self._buf = np.empty(0, np.uint64)
        self._at = 0
        self.words_read = 0
        self._forks = noise.forks()

    def __reduce_ex__(self, protocol):
        raise TypeError(_NO_COPY)

    def __copy__(self):
        raise TypeError(_NO_COPY)

    def __deepcopy__(self, memo):
        raise TypeError(_NO_COPY)

    def word(self) -> int:
        noise.check_not_forked(self._forks)
        if self._at >= len(self._buf):
            self._buf, self._at = self.stream.words(_BUFFER_WORDS), 0
        w = int(self._buf[self._at])
        self._at += 1
        self.words_read += 1
        return w

    def below(self, bound: int) -> int:
        """Uniform on range(bound), exactly: the low bits of a word, rejected until they fall below ``bound``."""
        bound = int(bound)
        if not 1 <= bound <= 1 << 64:
            raise ValueError(f"bound must be in [1, 2^64], got {bound}")
        mask = (1 << (bound - 1).bit_length()) - 1
        while True:
            v = self.word() & mask
            if v < bound:
                return v


def bernoulli(bits: Bits, p: Fraction) -> bool:
    """True with probability exactly ``p`` (a rational in [0, 1]): U < p for a uniform U read 64 bits at a time."""
    p = Fraction(p)
    if not 0 <= p <= 1:
        raise ValueError(f"p must be in [0, 1], got {p}")
    n, d = p.numerator, p.denominator
    w, k = 0, 0
    while True:
        w, k = (w << 64) | bits.word(), k + 64
        t = (n << k) // d  # floor(p 2^k): U lies in [w / 2^k, (w + 1) / 2^k)
        if w < t:
            return True
        if w > t:
            return False


def bernoulli_exp(bits: Bits, gamma: Fraction) -> bool:
    """True with probability exactly exp(-gamma), gamma a rational >= 0 (Canonne, Kamath, Steinke 2020, Alg. 1)."""
    gamma = Fraction(gamma)
    if gamma < 0:
        raise ValueError(f"gamma must be >= 0, got {gamma}")
    whole = math.floor(gamma)
    for _ in range(whole):  # exp(-gamma) = exp(-1)^floor(gamma) exp(-(gamma - floor(gamma)))
        if not _bernoulli_exp_unit(bits, Fraction(1)):
            return False
    return _bernoulli_exp_unit(bits, gamma - whole)


def _bernoulli_exp_unit(bits: Bits, gamma: Fraction) -> bool:
    """gamma in [0, 1]: K = the first k whose Bernoulli(gamma / k) fails; P(K > k) = gamma^k / k!, so P(K odd) =
    e^-gamma."""
    k = 1
    while bernoulli(bits, gamma / k):
        k += 1
    return k % 2 == 1


def exponential_mechanism(
    scores: Sequence[Fraction | int], *, epsilon: Fraction, sensitivity: Fraction, bits: Bits
) -> int:
    """Index i with probability proportional to exp(epsilon q_i / (2 sensitivity)), exactly (see the module doc)."""
    epsilon, sensitivity = Fraction(epsilon), Fraction(sensitivity)
    if not (epsilon > 0 and sensitivity > 0):
        raise ValueError("epsilon and sensitivity must be positive")
    q = [Fraction(s) for s in scores]
    if not q:
        raise ValueError("no candidates")
    top = max(q)
    gammas = [epsilon * (top - s) / (2 * sensitivity) for s in q]
    while True:
        i = bits.below(len(q))
        if bernoulli_exp(bits, gammas[i]):
            return i


def exact_epsilon(epsilon: float, bits: int = 30) -> Fraction:
    """``epsilon`` rounded DOWN to a multiple of 2^-bits, as an exact rational (a round then spends at most its
    accounted epsilon, and its gammas keep small denominators)."""
    if not (epsilon > 0 and math.isfinite(epsilon)):
        raise ValueError(f"epsilon must be positive and finite, got {epsilon}")
    return Fraction(math.floor(Fraction(epsilon) * (1 << bits)), 1 << bits)
