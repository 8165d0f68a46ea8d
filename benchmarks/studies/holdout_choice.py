"""Which model the synthetic hold-out would choose, beside what the real test rows chose: stacked, network or probe.

    python -m benchmarks.studies.holdout_choice                                   # the first command's cell
    python -m benchmarks.studies.holdout_choice --dataset digits --variant dpcda/poisson --eps 10 --l 16

The default recipe `stacked` was chosen over the network alone (`grouped`) and the probe on real-test accuracy
(Table 3). This re-creates releases of one Table 3 cell (``reproduce_table3.release_and_train``, the same seeds: release
r of the cell has seed ``crc32(dataset/mechanism/variant/eps) % 10^6 + l + 1000 r``), trains the default recipe once
per release, and records each of the three models on the real test rows and on the synthetic hold-out (10 % of the
synthetic rows, scored against their released labels). The probe's fit saw the hold-out rows and the stack's weights
were fitted on them, so their hold-out figures lean their way. Writes benchmarks/results/holdout_choice_<dataset>.md
(and .csv), opening with the command.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

import numpy as np
import torch

from benchmarks.files import RESULTS, write_csv, write_text
from benchmarks.reproduce.reproduce_table3 import VARIANTS, cell_release, load
from dpcda.mechanisms.inprocess import first_pass
from dpcda.pipeline.prepare import FASHION_MNIST_DIR

MODELS = ("stacked", "network", "probe")
FIELDS = ("dataset", "cell", "l", "release", "seed", "network_weight") + tuple(
    f"{where}_{m}" for where in ("real", "holdout") for m in MODELS
)


def measure(data, args, release: int) -> dict:
    got, seed, l = cell_release(data, args.dataset, args.variant, args.eps, args.l, release, args.epochs)
    if got is None:
        raise SystemExit(f"{args.variant} does not apply to {args.dataset}'s rows")
    res = got[0]
    real, holdout = res["real_test_accuracy"], res["synthetic_holdout_accuracy"]
    return {
        "dataset": args.dataset,
        "cell": f"{args.variant} eps {args.eps}",
        "l": l,
        "release": release,
        "seed": seed,
        "network_weight": real["stacked"]["weights"]["network"] if real["stacked"]["weights"] else "",
        "real_stacked": real["stacked"]["accuracy_mean"],
        "real_network": real["network"]["accuracy_mean"],
        "real_probe": real["probe"]["accuracy"],
        **{f"holdout_{m}": holdout.get(m, float("nan")) for m in MODELS},
    }


def report(rows, command: str) -> str:
    mean = {f"{w}_{m}": float(np.mean([r[f"{w}_{m}"] for r in rows])) for w in ("real", "holdout") for m in MODELS}
    best = {w: max(mean[f"{w}_{m}"] for m in MODELS) for w in ("real", "holdout")}
    pick = {w: " and ".join(f"`{m}`" for m in MODELS if mean[f"{w}_{m}"] == best[w]) for w in best}
    lines = [
        f"# Which model the synthetic hold-out would choose: {rows[0]['dataset']}, {rows[0]['cell']}, l {rows[0]['l']}",
        "",
        f"Command: `{command}`",
        "",
        "Each release trained once with the default recipe `stacked`; the three models (the stack, the network alone, "
        "the linear probe alone) scored on the real test rows and on the synthetic hold-out (10 % of the synthetic "
        "rows against their released labels). The probe's fit saw the hold-out rows and the stack's weights were "
        "fitted on them: their hold-out figures lean their way.",
        "",
        "| release | seed | network weight | real: stacked | real: network | real: probe | hold-out: stacked | "
        "hold-out: network | hold-out: probe |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        w = f"{r['network_weight']:.2f}" if r["network_weight"] != "" else "-"
        lines.append(
            f"| {r['release']} | {r['seed']} | {w} | "
            + " | ".join(f"{r[f'{x}_{m}']:.4f}" for x in ("real", "holdout") for m in MODELS)
            + " |"
        )
    lines.append(
        "| mean | | | " + " | ".join(f"{mean[f'{x}_{m}']:.4f}" for x in ("real", "holdout") for m in MODELS) + " |"
    )
    lines += [
        "",
        f"By mean accuracy the real test rows pick {pick['real']}; the synthetic hold-out would pick "
        f"{pick['holdout']} (a tie names each).",
    ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="fashion-mnist", choices=["fashion-mnist", "digits"])
    ap.add_argument("--variant", default="dpcda/fixed+lowpass", choices=[f"{m}/{v}" for m, v, _ in VARIANTS])
    ap.add_argument("--eps", default="10")
    ap.add_argument("--l", type=int, default=16)
    ap.add_argument("--releases", type=int, default=3, help="releases 0 .. R-1 of the cell")
    ap.add_argument("--epochs", type=int, default=None, help="(default: Table 3's, 5 on Fashion-MNIST, 20 on digits)")
    ap.add_argument("--source", default=FASHION_MNIST_DIR)
    ap.add_argument("--out", default=RESULTS)
    args = ap.parse_args(argv)
    flags = shlex.join(sys.argv[1:] if argv is None else list(argv))
    command = f"OMP_NUM_THREADS={torch.get_num_threads()} python -m benchmarks.studies.holdout_choice {flags}".strip()
    x, y, tx, ty, lowpass = load(args.dataset, args.source)
    data = (x, y, tx, ty, first_pass(x, y), lowpass)
    rows = []
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, f"holdout_choice_{args.dataset.replace('-', '_')}")
    for r in range(args.releases):
        rows.append(measure(data, args, r))
        print({k: round(v, 4) if isinstance(v, float) else v for k, v in rows[-1].items()}, flush=True)
        write_csv(stem + ".csv", FIELDS, rows)
        write_text(stem + ".md", report(rows, command))


if __name__ == "__main__":
    main()
