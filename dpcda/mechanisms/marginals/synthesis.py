"""From exact counts to rows: measure (the only step that sees the data), fit, and sample lazily, block by block."""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from typing import Callable, Iterator, Optional

import numpy as np

from dpcda.mechanisms.base import PlanError
from dpcda.mechanisms.marginals.counting import MarginalCounter
from dpcda.mechanisms.marginals.domain import rows_of
from dpcda.mechanisms.marginals.estimation import decompress, fit, sample_codes
from dpcda.mechanisms.marginals.limits import sample_block_rows
from dpcda.mechanisms.marginals.noisy import noisy_summary
from dpcda.mechanisms.marginals.plan import MarginalsPlan
from dpcda.mechanisms.marginals.residual import sampling_rules, stated_absent
from dpcda.mechanisms.marginals.selection import measure
from dpcda.privacy.noise import NoiseStream

log = logging.getLogger(__name__)


def fit_and_sample(
    acc: np.ndarray,
    plan,
    schema,
    key: bytes,
    chunk_rows: int,
    integers: frozenset = frozenset(),
    on_fit: Optional[Callable] = None,
) -> tuple[MarginalsPlan, Iterator[tuple[np.ndarray, np.ndarray]]]:
    """The stated ``MarginalsPlan`` (picked pairs, the model's total, the rows sampled) and (encoded rows, labels)
    chunks of the plan's ``samples_total`` rows (None: the fitted model's total, rounded), from the exact counts
    ``acc`` (``MarginalCounter``). ``integers``: the numeric columns whose Arrow type is an integer (their values are
    drawn among the integers of their bin). ``on_fit``: called with the noisy measurements and the fitted model once
    the fit is done (the release keeps them: ``marginals.model``)."""
    mp: MarginalsPlan = plan.synthesis
    counter = MarginalCounter(mp.domain)
    start = time.time()
    measured = measure(counter, acc, mp, key)
    del acc  # from here on only noisy counts
    # the table's public rules and the residual codes with no mass (None: neither); a merged code's draw weights
    kept, weights = sampling_rules(schema, mp.domain, integers, measured.one_way, measured.one_way_std)
    model = fit(measured, mp, kept)
    if on_fit is not None:
        on_fit(measured, model)
    names = mp.domain.names
    rows = mp.samples_total if mp.samples_total is not None else rows_of_total(float(model.total))
    stated = dataclasses.replace(
        mp,
        selected=tuple(tuple(names[i] for i in cl) for cl in measured.pairs),
        aim=measured.record,
        estimated_total=float(model.total),
        fit_seconds=round(time.time() - start, 2),
        noisy=noisy_summary(measured, mp.domain),  # DP: what the quality report sets beside the rows
        samples_total=rows,
        rows_from_model=mp.samples_total is None,
        absent=stated_absent(schema, mp.domain, kept.absent) if kept else {},
    )
    log.info("stage=marginals fitted cliques=%d seconds=%.1f", len(measured.pairs), time.time() - start)
    values, spread = NoiseStream(key, "marginals", "values"), NoiseStream(key, "marginals", "decompress")
    block_rows = sample_block_rows(len(mp.domain.sizes), chunk_rows)  # cut where the chunks are cut

    if kept:
        again = kept.resampler(model, key, measured.mapping, weights)
        rule_draws = NoiseStream(key, "marginals", "rules")

    def chunks():  # lazy: the rows are drawn block by block as the writer takes them
        for codes in sample_codes(model, rows, mp, key, block_rows):
            codes = decompress(codes, measured.mapping, spread, weights)
            if kept:
                codes = kept.keep_codes(codes, measured.mapping, again, rule_draws)
            for lo in range(0, len(codes), chunk_rows):
                x, y = rows_of(codes[lo : lo + chunk_rows], schema, mp.domain.bins, values, integers)
                yield (kept.keep_values(x, codes[lo : lo + chunk_rows], rule_draws) if kept else x), y
        if kept:
            log.info("stage=marginals rules kept=%s", kept.stated)

    return stated, chunks()


def rows_of_total(total: float) -> int:
    """The released row count from the fitted model's total (mbi's minimum-variance combination of every noisy
    count's sum: DP, post-processing), rounded to the nearest integer, at least 1."""
    if not math.isfinite(total):  # the model is DP: refusing on it says nothing about the records
        raise PlanError("marginals: the fitted model's total is not finite; nothing was published")
    return max(1, int(round(total)))


def integer_columns(source: str, table) -> frozenset:
    """Numeric columns of the table whose type in the input's Parquet footer (public, read without a row) is an
    integer (a date or timestamp: stored as one)."""
    import pyarrow as pa

    from dpcda.schemas.table import physical_integer
    from dpcda.storage.paths import expand_glob
    from dpcda.storage.tables import arrow_schema_of

    files = expand_glob(source)
    if not files:
        return frozenset()
    arrow = arrow_schema_of(files[0])
    names = {c.name for c in table.columns if c.kind == "numeric"}
    return frozenset(f.name for f in arrow if f.name in names and pa.types.is_integer(physical_integer(f.type)))
