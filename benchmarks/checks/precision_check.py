"""Does bf16 training change what the evaluation measures? The same releases trained in float32 and in bf16.

    python -m benchmarks.checks.precision_check                      # 3 releases, fixed+lp16, l = 16, eps 10, 10 epochs
    python -m benchmarks.checks.precision_check --releases 2 --epochs 3 --calibration fixed --l 4

Each release (a fresh noise key) is trained twice with the same training seed: once with float32 and once with bf16
autocast (channels-last both times). Prints and writes benchmarks/results/precision_check.{md,csv}: accuracy per
release and precision, the paired difference, its mean and standard error, and the training rows/s of each.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from benchmarks.files import write_csv, write_text
from benchmarks.reproduce.reproduce_table2 import OUT, synthesize
from dpcda.evaluation.train import Recipe, train_and_score
from dpcda.mechanisms.combiners import FirstPassCombiner
from dpcda.mechanisms.plan import normalize
from dpcda.pipeline.prepare import FASHION_MNIST_DIR, load_fashion_mnist


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--releases", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--calibration", default="fixed+lp16")
    ap.add_argument("--l", type=int, default=16)
    ap.add_argument("--eps", default="10")
    ap.add_argument("--source", default=FASHION_MNIST_DIR)
    ap.add_argument("--out", default=OUT)
    args = ap.parse_args(argv)
    x, y = load_fashion_mnist("train", args.source)
    xt, yt = load_fashion_mnist("test", args.source)
    comb = FirstPassCombiner((0.0, 1.0))
    first = comb.add(comb.create(), x, y)
    rows = []
    for r in range(args.releases):
        feats, labels, plan = synthesize(
            x, y, first, calibration=args.calibration, eps=args.eps, l=args.l, seed=1000 + r, device="cpu"
        )
        test = normalize(xt, plan.mean, plan.std, plan.clip, plan.bounds)
        for precision in ("float32", "bf16"):
            t = time.time()
            res = train_and_score(
                feats,
                labels,
                test,
                yt,
                num_classes=10,
                epochs=args.epochs,
                seed=r,
                recipe=Recipe(precision=precision),
                device="cpu",
                progress=False,
            )
            secs = time.time() - t
            rows.append(
                {
                    "release": r,
                    "precision": precision,
                    "accuracy": res["accuracy_mean"],
                    "rows_per_s": res["train_rows"] * args.epochs / secs,
                    "seconds": secs,
                }
            )
            print(
                f"release {r} {precision}: accuracy {res['accuracy_mean']:.4f}, {rows[-1]['rows_per_s']:,.0f} rows/s",
                flush=True,
            )
    acc = {p: np.array([w["accuracy"] for w in rows if w["precision"] == p]) for p in ("float32", "bf16")}
    speed = {p: np.mean([w["rows_per_s"] for w in rows if w["precision"] == p]) for p in ("float32", "bf16")}
    diff = acc["bf16"] - acc["float32"]
    se = diff.std(ddof=1) / np.sqrt(len(diff)) if len(diff) > 1 else float("nan")
    lines = [
        f"# bf16 vs float32 training, {args.calibration}, l = {args.l}, eps {args.eps}, {args.epochs} epochs, "
        f"{args.releases} releases (CPU)",
        "",
        "| release | float32 | bf16 | bf16 - float32 |",
        "|---:|---:|---:|---:|",
    ]
    for r in range(args.releases):
        lines.append(f"| {r} | {acc['float32'][r]:.4f} | {acc['bf16'][r]:.4f} | {diff[r]:+.4f} |")
    lines += [
        "",
        f"mean: float32 {acc['float32'].mean():.4f} +- {acc['float32'].std():.4f}, bf16 "
        f"{acc['bf16'].mean():.4f} +- {acc['bf16'].std():.4f}; paired difference {diff.mean():+.4f} "
        f"(standard error {se:.4f})",
        f"training rows/s: float32 {speed['float32']:,.0f}, bf16 {speed['bf16']:,.0f} "
        f"({speed['bf16'] / speed['float32']:.2f}x)",
        "",
        f"Command: `python -m benchmarks.checks.precision_check --releases {args.releases} --epochs {args.epochs} "
        f"--calibration {args.calibration} --l {args.l} --eps {args.eps}`",
    ]
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    os.makedirs(args.out, exist_ok=True)
    write_text(os.path.join(args.out, "precision_check.md"), text)
    write_csv(os.path.join(args.out, "precision_check.csv"), list(rows[0]), rows)


if __name__ == "__main__":
    main()
