"""From exact counts to rows: measure (the only step that sees the data), fit, and sample lazily, block by block."""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Iterator

import numpy as np

from dpcda.mechanisms.marginals.counting import MarginalCounter
from dpcda.mechanisms.marginals.domain import rows_of
from dpcda.mechanisms.marginals.estimation import SAMPLE_ROWS, decompress, fit, sample_codes
from dpcda.mechanisms.marginals.noisy import noisy_summary
from dpcda.mechanisms.marginals.plan import MarginalsPlan
from dpcda.mechanisms.marginals.selection import measure
from dpcda.privacy.noise import NoiseStream

log = logging.getLogger(__name__)


def fit_and_sample(
    acc: np.ndarray, plan, schema, key: bytes, chunk_rows: int, integers: frozenset = frozenset()
) -> tuple[MarginalsPlan, Iterator[tuple[np.ndarray, np.ndarray]]]:
    """The stated ``MarginalsPlan`` (picked pairs, the model's total) and (encoded rows, labels) chunks of the plan's
    ``samples_total`` rows, from the exact counts ``acc`` (``MarginalCounter``). ``integers``: the numeric columns
    whose Arrow type is an integer (their values are drawn among the integers of their bin)."""
    mp: MarginalsPlan = plan.synthesis
    counter = MarginalCounter(mp.domain)
    start = time.time()
    measured = measure(counter, acc, mp, key)
    del acc  # from here on only noisy counts
    model = fit(measured, mp)
    names = mp.domain.names
    stated = dataclasses.replace(
        mp,
        selected=tuple(tuple(names[i] for i in cl) for cl in measured.pairs),
        aim=measured.record,
        estimated_total=float(model.total),
        fit_seconds=round(time.time() - start, 2),
        noisy=noisy_summary(measured, mp.domain),  # DP: what the quality report sets beside the rows
    )
    log.info("stage=marginals fitted cliques=%d seconds=%.1f", len(measured.pairs), time.time() - start)
    values, spread = NoiseStream(key, "marginals", "values"), NoiseStream(key, "marginals", "decompress")
    block_rows = max(1, SAMPLE_ROWS // chunk_rows) * chunk_rows  # blocks cut where the chunks are cut

    def chunks():  # lazy: the rows are drawn block by block as the writer takes them
        for codes in sample_codes(model, plan.samples_total, mp, key, block_rows):
            codes = decompress(codes, measured.mapping, spread)
            for lo in range(0, len(codes), chunk_rows):
                yield rows_of(codes[lo : lo + chunk_rows], schema, mp.domain.bins, values, integers)

    return stated, chunks()


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
