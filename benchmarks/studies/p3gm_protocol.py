"""Our P3GM releases scored the way seed 004 scored its own: its classifier and its epoch rule, beside Table 1's CNN.

    python -m benchmarks.studies.p3gm_protocol --runs 3 --resume

Seed 004's 0.7485 (Fashion-MNIST, eps 1) is not measured the way ``benchmarks.reproduce.p3gm_table`` measures ours. Its
public code (tsubasat/P3GM, ``ml_task/mnist_classification.py``; the paper's "Implementations of Classifiers") trains a
smaller CNN: Conv2D(28, 3x3, no activation), MaxPool 2x2, Dense 128 ReLU, Dropout 0.2, Dense 10 softmax, Adam at Keras'
defaults (lr 1e-3), batch 32. It trains one epoch at a time for at most 20, scores the *real test split* after each, and
stops at the first epoch that scores below the best so far, reporting that best. The number it reports is therefore
chosen on the test data it is reported on. (Its test split is also not the standard one: 10 % of the 70,000 images,
Section V.)

This benchmark regenerates releases of ``benchmarks.reproduce.p3gm_table``'s cells (the same key and seed, so the same
rows: the Table 1 accuracy is scored again and printed beside the one that table recorded) and scores each three ways:

* ``table1``: seed 000's Table 1 CNN, as ``p3gm_table`` (no choice looks at real data);
* ``seed004_fixed``: seed 004's classifier after ``--fixed-epochs`` epochs (no choice looks at real data);
* ``seed004_rule``: seed 004's classifier under its own rule (best real-test epoch before the first drop), the number
  comparable with the paper's 0.7485 and *not* a figure a release may quote.

The seed 004 classifier also runs once on the real training rows (z-scored with their exact, non-private per-pixel
statistics) as the ceiling under its own rule. Writes ``benchmarks/results/p3gm_protocol.{md,csv}``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
from torch import nn

from benchmarks.files import write_csv, write_text
from benchmarks.reproduce.p3gm_table import CELLS, LABELS, OUT, PAPER, _read, _summary, release_cell, score_release
from dpcda.evaluation.train import as_tensors
from dpcda.mechanisms.inprocess import first_pass
from dpcda.mechanisms.plan import normalize
from dpcda.pipeline.prepare import FASHION_MNIST_DIR, load_fashion_mnist

DEFAULT_CELLS = ["p3gm-eps1-b1500-e20", "p3gm-eps1", "p3gm-nonoise", "p3gm-eps10-b1500-e20"]
REAL = "real training rows"
FIELDS = [
    "cell",
    "epsilon",
    "release",
    "table1",
    "table1_recorded",
    "seed004_fixed",
    "seed004_rule",
    "rule_epoch",
    "curve",
    "seconds",
]


class Seed004CNN(nn.Module):
    """Seed 004's image classifier (its Keras Sequential model, with Keras' default initialisation)."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(1, 28, kernel_size=3),  # Keras Conv2D without an activation
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(28 * 13 * 13, 128),
            nn.ReLU(),
            nn.Dropout(0.2),
            nn.Linear(128, num_classes),  # softmax is in the loss
        )
        for m in self.net:
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.xavier_uniform_(m.weight)  # Keras' glorot_uniform
                nn.init.zeros_(m.bias)

    def forward(self, x):
        return self.net(x)


def seed004_rule(curve: list[float]) -> tuple[float, int]:
    """(accuracy, epoch) seed 004's loop reports: the best real-test accuracy before the first epoch scoring below it.
    Its code stores nothing when no epoch drops within its 20 (its ``temp_results[-1]`` then raises and the run is
    scored 0 by a bare ``except``); here such a run reports its best epoch."""
    best, at = -1.0, 0
    for epoch, acc in enumerate(curve, 1):
        if acc < best:
            return best, at
        best, at = acc, epoch
    return best, at


def seed004_curve(x, y, tx, ty, *, seed: int, max_epochs: int = 20, fixed_epochs: int = 5, batch: int = 32):
    """Real-test accuracy after each epoch of seed 004's classifier trained on (x, y), until its rule has stopped and
    ``fixed_epochs`` have run (the curve up to an epoch does not depend on how many epochs follow)."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)  # initialisation and dropout
    model = Seed004CNN()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-7)  # Keras' Adam defaults
    xt, yt = as_tensors(x, y, "cpu")
    txt, tyt = as_tensors(tx, ty, "cpu")
    xt, txt = xt.reshape(-1, 1, 28, 28), txt.reshape(-1, 1, 28, 28)
    loss_fn = nn.CrossEntropyLoss()
    curve: list[float] = []
    for _ in range(max_epochs):
        model.train()
        for idx in torch.randperm(len(yt), generator=gen).split(batch):
            opt.zero_grad(set_to_none=True)
            loss_fn(model(xt[idx]), yt[idx]).backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            pred = torch.cat([model(txt[i : i + 1000]).argmax(1) for i in range(0, len(tyt), 1000)])
        curve.append(float((pred == tyt).float().mean()))
        stopped = seed004_rule(curve)[1] < len(curve)
        if stopped and len(curve) >= fixed_epochs:
            break
    return curve


def score_row(cell, release, epsilon, feats, labels, tx_norm, ty, fixed_epochs, table1=None, recorded=None):
    t0 = time.time()
    curve = seed004_curve(feats, labels, tx_norm, ty, seed=release * 1000, fixed_epochs=fixed_epochs)
    rule, at = seed004_rule(curve)
    return {
        "cell": cell,
        "epsilon": epsilon,
        "release": release,
        "table1": "" if table1 is None else table1,
        "table1_recorded": "" if recorded is None else recorded,
        "seed004_fixed": curve[fixed_epochs - 1],
        "seed004_rule": rule,
        "rule_epoch": at,
        "curve": " ".join(f"{a:.4f}" for a in curve),
        "seconds": round(time.time() - t0, 1),
    }


def _mean_std(values):
    """``p3gm_table._summary`` of the values given ("-" where a column is empty, as the real rows' Table 1 column)."""
    values = [v for v in values if v != ""]
    return _summary(values)[0] if values else "-"


def write_md(rows, path, command, fixed_epochs):
    by: dict[str, list] = {}
    for r in rows:
        by.setdefault(r["cell"], []).append(r)
    lines = [
        f"Generated by `{command}`. Each P3GM release is regenerated from `benchmarks.reproduce.p3gm_table`'s cell "
        "(the same key and seed: its Table 1 accuracy, scored again, sits beside the one that table recorded) and "
        f"scored three ways on the real test split: seed 000's Table 1 CNN; seed 004's classifier after {fixed_epochs} "
        "epochs; "
        "seed 004's classifier under seed 004's own rule (train up to 20 epochs, score the real test split after each, "
        "report the best before the first drop). **The last column is chosen on the test data it reports, as seed "
        "004's 0.7485 was**: it is here to compare with the paper, not a figure a release may quote. 2-core CPU.\n",
        "| method | eps | releases | Table 1 CNN | (recorded) | seed 004 CNN, "
        f"{fixed_epochs} epochs | seed 004 CNN, its rule (test-selected) | rule's epochs |",
        "|---|---:|---:|---|---|---|---|---|",
        f"| P3GM, seed 004 as reported (its Table VII) | 1 | - | - | - | - | {PAPER['p3gm']:.4f} | - |",
        "| VAE (not private), seed 004 as reported | inf | - | - | - | - | 0.7854 | - |",
    ]
    table_iv = "P3GM, seed 004's Table IV (expected batch 300, 4 epochs)"  # regenerated: no "measured at" here
    labels = {
        **LABELS,
        "p3gm-eps1": table_iv,
        "p3gm-eps10": table_iv,
        REAL: "seed 004's classifier on the real training rows (not private, exact z-score)",
    }
    for name, rs in by.items():
        eps = float(rs[0]["epsilon"])
        lines.append(
            f"| {labels.get(name, name)} | {eps:.3g} | {len(rs)} | {_mean_std([r['table1'] for r in rs])} | "
            f"{_mean_std([r['table1_recorded'] for r in rs])} | {_mean_std([r['seed004_fixed'] for r in rs])} | "
            f"{_mean_std([r['seed004_rule'] for r in rs])} | {', '.join(str(r['rule_epoch']) for r in rs)} |"
        )
    write_text(path, "\n".join(lines) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", nargs="+", default=DEFAULT_CELLS, choices=list(CELLS))
    ap.add_argument("--runs", type=int, default=1, help="releases per cell (release seeds 0 .. runs-1)")
    ap.add_argument("--epochs", type=int, default=5, help="Table 1 CNN epochs (as benchmarks.reproduce.p3gm_table)")
    ap.add_argument("--fixed-epochs", type=int, default=5, help="seed 004 CNN epochs for the test-free column")
    ap.add_argument("--out", default=OUT)
    ap.add_argument("--resume", action="store_true", help="keep (cell, release) rows already in the CSV")
    ap.add_argument("--source", default=FASHION_MNIST_DIR)
    args = ap.parse_args(argv)
    command = "python -m benchmarks.studies.p3gm_protocol " + " ".join(sys.argv[1:] if argv is None else argv)
    csv_path = os.path.join(args.out, "p3gm_protocol.csv")
    md = os.path.join(args.out, "p3gm_protocol.md")
    rows = _read(csv_path) if args.resume else []
    done = {(r["cell"], int(r["release"])) for r in rows}
    table = _read(os.path.join(args.out, "p3gm_fashion_mnist.csv"))
    recorded = {(r["cell"], int(r["release"])): r["accuracy"] for r in table}
    x, y = load_fashion_mnist("train", args.source)
    tx, ty = load_fashion_mnist("test", args.source)

    def finish(row):
        print(f"{row['cell']} release {row['release']}: {row}", flush=True)
        rows.append(row)
        write_csv(csv_path, FIELDS, rows)
        write_md(rows, md, command, args.fixed_epochs)

    if (REAL, 0) not in done:
        mean, std = x.mean(0), x.std(0) + 1e-6  # exact statistics: this row is not private and says so
        finish(score_row(REAL, 0, "inf", (x - mean) / std, y, (tx - mean) / std, ty, args.fixed_epochs))
    first = first_pass(x, y)
    for release in range(args.runs):  # release-major, as p3gm_table
        for name in args.cells:
            if (name, release) in done:
                continue
            feats, labels, plan = release_cell(name, release, x, y, first)
            table1 = score_release(feats, labels, plan, tx, ty, args.epochs, release)
            tx_norm = normalize(tx, plan.mean, plan.std, plan.clip, plan.bounds)
            finish(
                score_row(
                    name, release, plan.accounting.epsilon, feats, labels, tx_norm, ty, args.fixed_epochs,
                    table1=table1, recorded=recorded.get((name, release)),
                )
            )  # fmt: skip
    write_md(rows, md, command, args.fixed_epochs)
    print(open(md).read())
    return 0


if __name__ == "__main__":
    sys.exit(main())
