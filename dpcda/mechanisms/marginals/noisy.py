"""The noisy measurements a quality report sets beside the release's rows (``evaluation.quality``), as JSON.

Everything here is post-processing of the DP counts of ``measure`` (``Measurements``): no exact count reaches it, so
what it returns may be published. It keeps what a reader of one column and of the label's trends needs:

- ``one_way``: per column of the domain (the label last), its noisy one-way counts on the column's own codes and their
  noise std; a column measured more than once (AIM's one-column rounds) gets the inverse-variance combination of its
  measurements (the minimum-variance unbiased one) and that combination's std;
- ``label_pairs``: per column whose pair with the label was measured (MST's picks that hold the label, mst-label's
  pairs, AIM's rounds), its noisy two-way counts (column codes x label codes), combined the same way, with each
  axis's compression (MST's ``compression``: code -> measured code, the last measured code the merged one) or null.

The saved model of a release (its measurements and domain) holds the same counts; a quality report of a saved model
reads them through this function.
"""

from __future__ import annotations

import numpy as np

from dpcda.mechanisms.marginals.domain import Domain
from dpcda.mechanisms.marginals.plan import Measurements


def _combined(parts: list) -> tuple[np.ndarray, float]:
    """(counts, std) of one marginal measured once or more: the inverse-variance weighted mean and its std."""
    if len(parts) == 1:
        return np.asarray(parts[0][0], np.float64), float(parts[0][1])
    w = np.array([1.0 / float(s) ** 2 for _, s in parts])
    y = sum(wi * np.asarray(v, np.float64) for wi, (v, _) in zip(w, parts)) / w.sum()
    return y, float(1.0 / np.sqrt(w.sum()))


def noisy_summary(measured: Measurements, domain: Domain) -> dict:
    """The one-way counts of every column and the label's two-way counts with each measured column (module doc)."""
    n = len(domain.sizes)
    label = n - 1
    ones: dict = {i: [(y, measured.one_way_std)] for i, y in enumerate(measured.one_way)}
    pairs: dict = {}
    for clique, y, std in zip(measured.pairs, measured.two_way, measured.stds):
        clique = tuple(int(c) for c in clique)
        if len(clique) == 1:  # AIM: a column measured again in a round
            ones[clique[0]].append((y, std))
        elif label in clique and len(clique) == 2:
            pairs.setdefault(clique[0] if clique[1] == label else clique[1], []).append((y, std))

    def axis(i):
        m = measured.mapping.get(i)
        return None if m is None else [int(v) for v in m]

    one_way = []
    for i in range(n):
        y, std = _combined(ones[i])
        one_way.append({"column": domain.names[i], "counts": y.ravel().tolist(), "std": std})
    label_pairs = []
    for i in sorted(pairs):
        y, std = _combined(pairs[i])
        label_pairs.append(
            {
                "column": domain.names[i],
                "counts": np.asarray(y, np.float64).tolist(),
                "std": std,
                "column_codes": axis(i),
                "label_codes": axis(label),
            }
        )
    return {
        "domain": {"names": list(domain.names), "sizes": list(domain.sizes), "bins": domain.bins},
        "one_way": one_way,
        "label_pairs": label_pairs,
    }
