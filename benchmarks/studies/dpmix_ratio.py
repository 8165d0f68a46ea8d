"""DPMix's label-noise ratio R = sigma_y / sigma_x, measured: the default of --label-noise-ratio comes from here.

    python -m benchmarks.studies.dpmix_ratio                        # Fashion-MNIST, eps 10, l 16, R in {0.25 .. 4}
    python -m benchmarks.studies.dpmix_ratio --dataset digits --l 4 # a quick look

For each R the release is calibrated to the same (eps, delta) (one Gaussian event for features and labels:
z = l / sqrt(4c^2/sigma_x^2 + 2/sigma_y^2)), so a smaller R buys less feature noise with noisier labels. Each cell
is a release through the product's in-process path and the evaluation CNN trained on the soft labels, tested on
the real test split. Writes benchmarks/results/dpmix_ratio_<dataset>.{md,csv}.
"""

from __future__ import annotations

import argparse
import os

import numpy as np

from benchmarks.files import write_csv, write_text
from benchmarks.reproduce.reproduce_table3 import OUT, load, run_release
from dpcda.mechanisms.inprocess import first_pass


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="fashion-mnist", choices=["fashion-mnist", "digits"])
    ap.add_argument("--eps", default="10")
    ap.add_argument("--l", type=int, default=16)
    ap.add_argument("--ratios", type=float, nargs="+", default=[0.25, 0.5, 1.0, 2.0, 4.0])
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--epochs", type=int, default=None, help="(default: 5 on Fashion-MNIST, 20 on digits)")
    ap.add_argument("--out", default=OUT)
    args = ap.parse_args(argv)
    x, y, tx, ty, lowpass = load(args.dataset, "/usr/share/datasets/fashion-mnist")
    first = first_pass(x, y)
    epochs = args.epochs or (5 if args.dataset == "fashion-mnist" else 20)
    rows = []
    for ratio in args.ratios:
        accs, sigma = [], None
        for r in range(args.runs):
            acc, sigma = run_release(
                x, y, tx, ty, first, dict(mechanism="dpmix", mode="fixed", label_noise_ratio=ratio),
                eps=args.eps, l=args.l, seed=7000 + 100 * r + int(ratio * 16), epochs=epochs, num_classes=10,
                lowpass=lowpass,
            )  # fmt: skip
            accs.append(acc)
        row = {
            "ratio": ratio,
            "sigma_x": sigma,
            "sigma_y": sigma * ratio,
            "mean": float(np.mean(accs)),
            "std": float(np.std(accs)),
            "runs": len(accs),
        }
        rows.append(row)
        print(f"R={ratio:g} sigma_x={sigma:.4g} sigma_y={sigma * ratio:.4g} acc={row['mean']:.4f}", flush=True)
    stem = os.path.join(args.out, f"dpmix_ratio_{args.dataset.replace('-', '_')}")
    write_csv(stem + ".csv", list(rows[0]), rows)
    lines = [
        f"# DPMix label-noise ratio, {args.dataset}, eps {args.eps}, l = {args.l}, {epochs} epochs",
        "",
        f"`python -m benchmarks.studies.dpmix_ratio --dataset {args.dataset} --eps {args.eps} --l {args.l} "
        f"--runs {args.runs}`",
        "",
        "| R = sigma_y / sigma_x | sigma_x | sigma_y | accuracy | runs |",
        "|---|---|---|---|---|",
        *[
            f"| {r['ratio']:g} | {r['sigma_x']:.4g} | {r['sigma_y']:.4g} | {r['mean']:.4f} +- {r['std']:.4f} | "
            f"{r['runs']} |"
            for r in rows
        ],
    ]
    write_text(stem + ".md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
