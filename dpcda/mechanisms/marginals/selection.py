"""MST's selection (McKenna, Miklau and Sheldon 2021): the noisy one-way counts, pairs picked by the exponential
mechanism on independence scores, their noisy two-way counts; ``measure`` dispatches to AIM (``marginals.aim``)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from dpcda.mechanisms.marginals.aim import measure_aim
from dpcda.mechanisms.marginals.counting import CompressedCounter, MarginalCounter, compression
from dpcda.mechanisms.marginals.plan import AIM, SCORE_BITS, MarginalsPlan, Measurements
from dpcda.privacy.noise import NoiseStream


class _DisjointSet:
    def __init__(self, n: int):
        self.parent = list(range(n))

    def find(self, a: int) -> int:
        while self.parent[a] != a:
            self.parent[a] = self.parent[self.parent[a]]
            a = self.parent[a]
        return a

    def union(self, a: int, b: int) -> None:
        self.parent[self.find(a)] = self.find(b)


def independence_scores(counter: MarginalCounter, acc: np.ndarray, one_way: list) -> dict:
    """Pair -> integer score, in units of 2^-SCORE_BITS: the L1 distance between the exact two-way counts and the
    counts the noisy one-way counts predict under independence, those rounded to the unit first (post-processing of
    DP counts, so the score's sensitivity stays exactly 1 count = 2^SCORE_BITS units)."""
    totals = [max(float(v.sum()), 0.0) for v in one_way]
    total = float(np.mean(totals)) if totals else 0.0
    probs = []
    for v in one_way:
        p = np.maximum(np.asarray(v, np.float64), 0.0)
        s = p.sum()
        probs.append(p / s if s > 0 else np.full(len(p), 1.0 / len(p)))
    unit = float(1 << SCORE_BITS)
    scores = {}
    for a, b in counter.domain.pairs:
        predicted = np.rint(total * np.outer(probs[a], probs[b]) * unit).astype(np.int64)
        exact = counter.marginal(acc, (a, b)).astype(np.int64) << SCORE_BITS
        scores[(a, b)] = int(np.abs(exact - predicted).sum())
    return scores


def select_mst(scores: dict, columns: int, round_epsilon: float, bits) -> list:
    """MST's selection: ``columns - 1`` exponential-mechanism rounds, each among the pairs that join two trees of the
    forest picked so far (a spanning tree at the end)."""
    from dpcda.privacy.exponential import exponential_mechanism

    forest = _DisjointSet(columns)
    picked = []
    eps, sensitivity = Fraction(round_epsilon), Fraction(1 << SCORE_BITS)
    for _ in range(columns - 1):
        candidates = [e for e in scores if forest.find(e[0]) != forest.find(e[1])]
        i = exponential_mechanism([scores[e] for e in candidates], epsilon=eps, sensitivity=sensitivity, bits=bits)
        a, b = candidates[i]
        forest.union(a, b)
        picked.append((a, b))
    return picked


def measure(counter: MarginalCounter, acc: np.ndarray, plan: MarginalsPlan, key: bytes) -> Measurements:
    """The noisy one-way counts, the picked pairs, their noisy two-way counts (the only outputs that see the data)."""
    from dpcda.privacy.exponential import Bits

    if plan.selection == AIM:
        return measure_aim(counter, acc, plan, key)
    ev = plan.event
    n = len(counter.domain.sizes)
    one_way = [NoiseStream(key, "marginals", "one-way", i).gaussian(counter.marginal(acc, (i,)), ev.one_way_std)
               for i in range(n)]  # fmt: skip
    mapping = compression(one_way, ev.one_way_std)
    small = CompressedCounter(counter, mapping)
    scores = independence_scores(small, acc, [small.one_way(i, y) for i, y in enumerate(one_way)])
    pairs = select_mst(scores, n, ev.round_epsilon, Bits(NoiseStream(key, "marginals", "select")))
    two_way = [
        NoiseStream(key, "marginals", "two-way", a, b).gaussian(small.marginal(acc, (a, b)), ev.two_way_std)
        for a, b in pairs
    ]
    if plan.selection == "mst-label":  # fixed in advance: every column with the label (the last), own streams
        for a in range(n - 1):
            pairs.append((a, n - 1))
            stream = NoiseStream(key, "marginals", "label-pair", a)
            two_way.append(stream.gaussian(small.marginal(acc, (a, n - 1)), ev.two_way_std))
    return Measurements(one_way, pairs, two_way, ev.one_way_std, [ev.two_way_std] * len(pairs), mapping=mapping)
