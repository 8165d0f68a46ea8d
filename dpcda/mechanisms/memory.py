"""Where a mixing group's rows are held: one worker's memory (the in-memory path) or nowhere at once (the join
path), decided on public sizes only (fixed: the exact class sizes, public there; poisson: the DP sizes plus a margin),
so the choice is public too."""

from __future__ import annotations

import os

from dpcda.mechanisms.base import PlanError

CLASS_BUDGET_SHARE = 0.4
JOIN_BLOCK_BYTES = 1 << 27  # records of one join block of the join path: 128 MiB of float64 rows
MIN_JOIN_BLOCK_ROWS = 1024


def default_class_budget() -> int:
    """40 % of this machine's memory (the workers that mix are assumed to be machines like it)."""
    try:
        return int(CLASS_BUDGET_SHARE * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def class_bytes(rows: float, dim: int) -> float:
    """Memory of one class on the mixing worker: our float64 copy of its rows and an int64 index, plus the runner's
    grouped float32 rows (a runner that holds groups in memory, like the DirectRunner, keeps them meanwhile)."""
    return float(rows) * (12 * dim + 8)


def check_class_memory(sizes, dim: int, budget: int, *, where: str, exact: bool, why: str = "") -> None:
    for k, n in enumerate(sizes):
        need = class_bytes(n, dim)
        if need > budget:
            size = f"{int(n)} records" if exact else "its DP size"
            raise PlanError(
                f"{where}: class {k} needs about {need / 2**30:.2f} GiB ({size} at d={dim}), more than "
                f"max_class_bytes={budget / 2**30:.2f} GiB, the limit of the in-memory mixer (one class "
                + (
                    f"on one worker); {why}"
                    if why
                    else "on one worker); use --mixing-path auto or join, or raise --max-class-bytes on bigger workers"
                )
            )


def join_block_rows(dim: int, requested: int = 0) -> int:
    """R: records per join block of the join path (a power of two; ``requested`` > 0 overrides)."""
    if requested > 0:
        return int(requested)
    rows = max(MIN_JOIN_BLOCK_ROWS, JOIN_BLOCK_BYTES // (8 * max(int(dim), 1)))
    return 1 << (rows.bit_length() - 1)


def choose_mixing_paths(
    sizes, dim: int, budget: int, path: str, *, where: str, exact: bool, why: str = ""
) -> tuple[str, ...]:
    """'memory' or 'join' for each group. ``sizes`` are public (fixed: exact class sizes; poisson: DP sizes plus a
    margin), so the choice is too; auto sends a group to the join path where it would not fit one worker."""
    if path == "memory":
        check_class_memory(sizes, dim, budget, where=where, exact=exact, why=why)
        return ("memory",) * len(sizes)
    if path == "join":
        return ("join",) * len(sizes)
    return tuple("join" if class_bytes(n, dim) > budget else "memory" for n in sizes)
