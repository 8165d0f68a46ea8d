"""The marginals' size, bounded before any row is read: columns, encoded width, count cells, model cells, and the
memory the counting and the fit take, all from the public schema.

What grows with what (``python -m benchmarks.perf.bench_marginals_size``, benchmarks/results/bench_marginals_size.md:
peak RSS of the release's process tree on generated tables):

- the process itself (Python, Beam, JAX, pyarrow) before any count: ``BASE_BYTES`` (0.9 to 1.3 GiB measured on
  tables of 11 to 26 columns at 20 bins), and ``COLUMN_BYTES`` per column (XLA's programs for the fit, mbi's sampling
  frames: 101 columns at 20 bins took 1.52 GiB against 1.17 for 11);
- the counts: one int64 per cell of every one- and two-way marginal (``Domain.cells``), held by the combiner's
  accumulators, the fit stage's copy and the selection's per-pair temporaries: ``COUNT_BYTES`` per cell;
- the model: MST's (and mst-label's) is a tree of measured pairs, at most its ``columns - 1`` largest pairs plus, for
  mst-label, the label's pairs (on uncompressed codes: compression only shrinks it); AIM's is capped by
  ``max_model_size``. mbi's mirror descent holds about ten float64 arrays of the model's cells (potentials,
  marginals, gradients, the line search's trial point, XLA's buffers): ``MODEL_BYTES`` per cell;
- the sampling: a block of int64 codes (``sample_block_rows``, mbi's frame and our copy) and a chunk of encoded rows.

11 numeric columns at 256, 512 and 768 bins (3.6, 14.4 and 32.5 million count cells, models of at most 0.7, 2.9 and
6.5 million) peaked at 1.12, 1.53 and 2.57 GiB: about 64 bytes per count cell with its model's share; ``footprint``
gives 1.5, 2.1 and 3.2 GiB for them. The release refuses a table whose footprint passes ``MAX_FIT_BYTES`` (at 1024 bins
those 11 columns take 4.7 GiB: the bad-input campaign's case passed the old cell check and went past 4 GiB in 30 s),
or whose columns, count cells or model cells pass theirs, with one line naming the figure and what lowers it, before
any row is read. Time grows with the same figures (the benchmark's CPU column): the fit's steps are
``marginals_iters`` passes over the model's cells, the counting one pass over the rows per marginal, MST's selection
a pass over every pair per round.
"""

from __future__ import annotations

import dataclasses

from dpcda.mechanisms.marginals.domain import Domain

MAX_COLUMNS = 128  # columns, the label included: MST's selection scores c(c-1)/2 pairs in each of its c - 1 rounds
MAX_CELLS = 1 << 26  # cells of every one-way and two-way count array a release holds (int64: 512 MiB a copy)
MAX_MODEL_CELLS = 1 << 25  # cells of the fitted model (float64: 256 MiB an array)
MAX_FIT_BYTES = 4 << 30  # the whole footprint (``footprint``): 4 GiB

BASE_BYTES = 1229 << 20  # the process before any count (1.2 GiB)
COLUMN_BYTES = 4 << 20  # per column
COUNT_BYTES = 48  # per count cell (six int64 copies at the peak)
MODEL_BYTES = 80  # per model cell (ten float64 arrays at the peak)
SAMPLE_ROWS = 1 << 18  # rows mbi draws in one call: the sampling holds this many rows, not the release's
SAMPLE_CELLS = 1 << 23  # codes drawn per sampling block: 2^18 rows of up to 32 columns, fewer rows if wider


def sample_block_rows(columns: int, chunk_rows: int) -> int:
    """Rows mbi draws per call: ``SAMPLE_CELLS`` codes (2^18 rows up to 32 columns, fewer for wider tables), cut
    where the writer's chunks are cut."""
    rows = min(SAMPLE_ROWS, max(1, SAMPLE_CELLS // max(columns, 1)))
    return max(1, rows // chunk_rows) * chunk_rows


def model_cells_bound(domain: Domain, selection: str, max_model_size: int | None) -> int:
    """The most cells the fitted model can take: AIM's cap; MST's tree, at most its ``columns - 1`` largest pairs,
    and for mst-label the label's pairs beside them."""
    n = len(domain.sizes)
    if n < 2:
        return sum(domain.sizes)
    if selection == "aim":
        return int(max_model_size)
    pairs = sorted((domain.sizes[a] * domain.sizes[b] for a, b in domain.pairs), reverse=True)
    cells = sum(pairs[: n - 1])
    if selection == "mst-label":
        cells += sum(domain.sizes[a] * domain.sizes[-1] for a in range(n - 1))
    return cells


@dataclasses.dataclass(frozen=True)
class Footprint:
    """A release's size figures (public: from the schema and the parameters)."""

    columns: int
    encoded_width: int
    count_cells: int
    model_cells: int
    sample_bytes: int

    @property
    def bytes(self) -> int:
        """The estimated peak memory of the release's process tree."""
        return (
            BASE_BYTES
            + COLUMN_BYTES * self.columns
            + COUNT_BYTES * self.count_cells
            + MODEL_BYTES * self.model_cells
            + self.sample_bytes
        )


def footprint(domain: Domain, encoded_width: int, selection: str, max_model_size: int | None, chunk_rows: int):
    """The ``Footprint`` of a release of ``domain`` (its encoded rows ``encoded_width`` floats wide)."""
    columns = len(domain.sizes)
    block = sample_block_rows(columns, chunk_rows)
    # a block of int64 codes (mbi's frame and our copy), and one chunk of float32 encoded rows at a time
    sample = 2 * 8 * block * columns + 4 * chunk_rows * encoded_width
    return Footprint(columns, encoded_width, domain.cells, model_cells_bound(domain, selection, max_model_size), sample)


def _gib(b: float) -> str:
    return f"{b / (1 << 30):.2f} GiB"


def refusal(fp: Footprint, bins: int, selection: str) -> str | None:
    """The one line that refuses a release of this footprint (the first bound it passes), or None."""
    fix = "drop columns or lower --marginals-bins"
    if fp.columns > MAX_COLUMNS:
        return f"marginals: the table has {fp.columns} columns (the label included), more than {MAX_COLUMNS}; drop some"
    if fp.count_cells > MAX_CELLS:
        return (
            f"marginals: the one- and two-way counts of this table take {fp.count_cells} cells at "
            f"marginals_bins={bins}, more than {MAX_CELLS}; {fix}"
        )
    if fp.model_cells > MAX_MODEL_CELLS:
        lower = "lower --marginals-max-model-size" if selection == "aim" else fix
        return (
            f"marginals: the fitted model can take {fp.model_cells} cells at marginals_bins={bins}, more than "
            f"{MAX_MODEL_CELLS}; {lower}"
        )
    if fp.bytes > MAX_FIT_BYTES:
        lower = fix + (" or --marginals-max-model-size" if selection == "aim" else "")
        return (
            f"marginals: counting and fitting this table takes about {_gib(fp.bytes)} of memory at "
            f"marginals_bins={bins}, more than {_gib(MAX_FIT_BYTES)}; {lower}"
        )
    return None
