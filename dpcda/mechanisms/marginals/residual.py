"""Residual codes a release does not draw: post-processing of the noisy one-way counts, no budget, no row read.

A schema keeps two codes for rows that may or may not exist: a nullable column's null (a derived schema makes every
column nullable, since a footer's null count is private; ``schema infer`` drafts ``nullable: true``) and a categorical
column's other bucket (the values the DP domain step did not release). Where the data holds none, the code's noisy
one-way count is noise only, and a model fitted to it gives the code a little mass (MST's compression merges it with
the column's rare cells and a merged draw picks among them uniformly): nulls in a column that has none, "(other)"
in a column whose every value was released.

So a residual code whose noisy one-way count is below ``ABSENT_SIGMAS`` stds of its measurement (MST's compression
criterion, ``counting.COMPRESS_SIGMAS``) is absent from the release: the model is conditioned on the column not
taking it (``rules.KeptRules``: a one-column group, as a rule that forbids the code), so a merged draw decompresses
among the column's other codes. The cost is stated: a column whose real nulls (or other values) are fewer than about
three stds loses them (the measurement could not tell them from none). Declared categories, spikes and bins are never
absent: they are the column's values, not its remainder.
"""

from __future__ import annotations

import numpy as np

from dpcda.mechanisms.marginals.counting import COMPRESS_SIGMAS
from dpcda.mechanisms.marginals.domain import Domain, _values

ABSENT_SIGMAS = COMPRESS_SIGMAS
NULL, OTHER = "null", "other"


def residual_codes(schema, dom: Domain) -> dict[int, dict[int, str]]:
    """Column index -> {residual code: 'null' or 'other'} for the columns of ``schema`` (the label has none)."""
    out: dict[int, dict[int, str]] = {}
    for i, col in enumerate(schema.columns):
        codes = {}
        if col.kind == "categorical" and col.other is not None:
            codes[len(col.categories)] = OTHER
        if col.nullable:
            codes[_values(col, dom.bins)] = NULL
        if codes:
            out[i] = codes
    return out


def absent_codes(schema, dom: Domain, one_way, std: float) -> dict[int, tuple[int, ...]]:
    """Column index -> the residual codes whose noisy one-way count (``one_way[i]``, Gaussian noise of ``std``) is
    below ``ABSENT_SIGMAS`` stds; the column's other codes stay allowed. Empty without noise (``std`` 0: the counts
    are exact, a code with none has none)."""
    if not std > 0:
        return {}
    out = {}
    for i, codes in residual_codes(schema, dom).items():
        y = np.asarray(one_way[i], np.float64).ravel()
        gone = tuple(c for c in sorted(codes) if y[c] < ABSENT_SIGMAS * std)
        if gone and len(gone) < dom.sizes[i]:
            out[i] = gone
    return out


def sampling_rules(schema, dom: Domain, integers: frozenset, one_way, std: float):
    """What a release's draws keep, from its noisy one-way counts: the table's rules with the absent residual codes
    (``rules.KeptRules``, or None where there are neither) and each code's weight in a merged draw
    (``estimation.code_weights``). The release (``synthesis``) and a saved model's sampling (``model``) both take
    them from here, so the two draw alike."""
    from dpcda.mechanisms.marginals.estimation import code_weights
    from dpcda.mechanisms.marginals.rules import kept_rules

    kept = kept_rules(schema, dom, integers, absent_codes(schema, dom, one_way, std))
    return kept, code_weights(one_way, kept.absent if kept else None)


def stated_absent(schema, dom: Domain, absent: dict) -> dict[str, list[str]]:
    """The manifest's account of ``absent``: column name -> 'null' and/or 'other'."""
    names = residual_codes(schema, dom)
    return {dom.names[i]: [names[i][c] for c in codes] for i, codes in sorted(absent.items())}
