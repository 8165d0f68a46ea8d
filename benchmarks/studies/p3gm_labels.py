"""P3GM's labels: how the decoder's argmax labels spread over the classes, how well they agree with the images, and
what seed 004's sampling (the training data's label ratio, Section VI) changes, on ONE fit sampled both ways.

    python -m benchmarks.studies.p3gm_labels --cell p3gm-eps1-b1500-e20 --release 0

One release of ``benchmarks.reproduce.p3gm_table``'s cell (the same config, seed and key, so the same fit as that
table's release) is sampled twice from its fitted model:
- ``as drawn``: rows as they come, label = the decoder's argmax (what ``--mechanism p3gm`` releases today);
- ``class quotas``: each chunk keeps rows, in the order drawn, while their label's quota is open, the quotas split from
  the DP class histogram the plan already released (``mechanisms.p3gm.class_quota``: post-processing, no budget).
For each: the label histogram; the share of rows whose label a CNN trained on the REAL training rows predicts (a
diagnostic that reads private rows, not DP: it says whether a label matches its image); and the evaluation CNN's
real-test accuracy, trained with the same seed on both. The fitted model is cached (``--cache``), so a rerun samples
and scores without fitting again. Writes benchmarks/results/p3gm_labels.{md,csv}.
"""

from __future__ import annotations

import argparse
import csv
import os
import pickle
import time

import numpy as np
import torch

from benchmarks.files import RESULTS, write_csv, write_text
from benchmarks.reproduce.p3gm_table import CELLS, SAMPLES_CELL, cell_config, release_cell, score_release
from dpcda.evaluation.train import Recipe, as_tensors, predict, stratified_split, train_one, use_bf16
from dpcda.mechanisms.inprocess import first_pass
from dpcda.mechanisms.p3gm import class_quota, sample_chunks, sample_rows
from dpcda.mechanisms.plan import normalize
from dpcda.pipeline.prepare import FASHION_MNIST_DIR, load_fashion_mnist
from dpcda.privacy.noise import key_from_test_seed

OUT = RESULTS
FIELDS = ["cell", "release", "sampling", "accuracy", "label_agreement", "label_counts", "dp_class_sizes", "seconds"]


def fit_or_load(cell: str, release: int, x, y, cache: str):
    """(model, spec, plan, cfg) of release ``release`` of ``cell``: fitted once, then read from ``cache``."""
    cfg = cell_config(cell, release)
    path = os.path.join(cache, f"{cell}-r{release}.pkl")
    if os.path.exists(path):
        with open(path, "rb") as fh:
            return (*pickle.load(fh), cfg)
    got = {}
    feats, labels, plan = release_cell(
        cell, release, x, y, first_pass(x, y), on_model=lambda model, spec: got.update(model=model, spec=spec)
    )
    again, again_labels = sample_all(got["model"], got["spec"], plan, cfg, release, quotas=False)
    if not (np.array_equal(again, feats) and np.array_equal(again_labels, labels)):
        raise SystemExit("p3gm_labels: resampling the fitted model did not give the release's rows")
    os.makedirs(cache, exist_ok=True)
    with open(path + ".tmp", "wb") as fh:
        pickle.dump((got["model"], got["spec"], plan), fh)
    os.replace(path + ".tmp", path)
    return got["model"], got["spec"], plan, cfg


def sample_all(model, spec, plan, cfg, release: int, *, quotas: bool):
    """The release's rows, chunk by chunk as ``release_in_process`` samples them, with or without class quotas."""
    feats, labels = [], []
    for chunk, rows in sample_chunks(plan, cfg.chunk_rows):
        quota = class_quota(rows, plan.dp_class_sizes) if quotas else None
        f, lab = sample_rows(
            model,
            spec,
            rows=rows,
            chunk=chunk,
            key=key_from_test_seed(release),
            clip=plan.clip,
            device="cpu",
            quota=quota,
        )
        feats.append(f)
        labels.append(lab)
    return np.concatenate(feats), np.concatenate(labels)


def reference_classifier(x, y, epochs: int, seed: int):
    """A CNN trained on the real (normalized) training rows with the evaluation recipe: it labels synthetic images."""
    recipe = Recipe()
    tr, val = stratified_split(y, recipe.val_fraction, seed)
    dev = torch.device("cpu")
    model, _ = train_one(
        *as_tensors(x[tr], y[tr], dev),
        *as_tensors(x[val], y[val], dev),
        num_classes=10,
        input_shape=(1, 28, 28),
        epochs=epochs,
        seed=seed,
        recipe=recipe,
        device=dev,
    )

    def labels_of(feats):
        xt, _ = as_tensors(feats, np.zeros(len(feats), np.int64), dev)
        return predict(model, xt, recipe.eval_batch, use_bf16(recipe, dev)).cpu().numpy()

    return labels_of


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cell", default=SAMPLES_CELL, choices=sorted(c for c in CELLS if c.startswith("p3gm")))
    ap.add_argument("--release", type=int, default=0, help="p3gm_table's release number (its seed and key)")
    ap.add_argument("--epochs", type=int, default=5, help="of the evaluation CNN and of the reference CNN")
    ap.add_argument("--source", default=FASHION_MNIST_DIR)
    ap.add_argument("--cache", default=os.path.join("/tmp", "dpcda-p3gm-labels"), help="where the fitted model is kept")
    ap.add_argument("--out", default=OUT)
    args = ap.parse_args(argv)
    x, y = load_fashion_mnist("train", args.source)
    tx, ty = load_fashion_mnist("test", args.source)
    model, spec, plan, cfg = fit_or_load(args.cell, args.release, x, y, args.cache)
    real = normalize(x, plan.mean, plan.std, plan.clip, plan.bounds)
    print("training the reference CNN on the real rows (diagnostic only)", flush=True)
    labels_of = reference_classifier(real, np.asarray(y, np.int64), args.epochs, seed=12345)
    rows = []
    for sampling, quotas in (("as drawn", False), ("class quotas", True)):
        t0 = time.time()
        feats, labels = sample_all(model, spec, plan, cfg, args.release, quotas=quotas)
        agree = float(np.mean(labels_of(feats) == labels))
        accuracy = score_release(feats, labels, plan, tx, ty, args.epochs, args.release)
        rows.append(
            {
                "cell": args.cell,
                "release": args.release,
                "sampling": sampling,
                "accuracy": round(accuracy, 4),
                "label_agreement": round(agree, 4),
                "label_counts": " ".join(str(int(c)) for c in np.bincount(labels, minlength=10)),
                "dp_class_sizes": " ".join(str(int(c)) for c in plan.dp_class_sizes),
                "seconds": round(time.time() - t0, 1),
            }
        )
        print(rows[-1], flush=True)
    write(rows, args)


def write(new_rows, args) -> None:
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "p3gm_labels.csv")
    rows = []
    if os.path.exists(path):
        with open(path) as fh:
            rows = [r for r in csv.DictReader(fh) if (r["cell"], r["release"]) != (args.cell, str(args.release))]
    rows += new_rows
    write_csv(path, FIELDS, rows)
    lines = [
        "# P3GM's labels: one fit, sampled as drawn and with the DP class histogram's quotas",
        "",
        "Generated by `python -m benchmarks.studies.p3gm_labels --cell CELL --release R` (one row pair per fit). "
        "Fashion-MNIST, "
        "delta 1e-5. `agreement`: the share of synthetic rows whose label a CNN trained on the real training rows "
        "predicts from the image (a diagnostic reading private rows; not DP, not released). `accuracy`: the "
        "evaluation CNN trained on the release (same seed for both samplings), tested on the real test split. "
        "`labels`: rows per class 0-9.",
        "",
        "| cell | release | sampling | accuracy | agreement | labels | DP class histogram |",
        "|---|---:|---|---:|---:|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['cell']} | {r['release']} | {r['sampling']} | {float(r['accuracy']):.4f} | "
            f"{float(r['label_agreement']):.4f} | {r['label_counts']} | {r['dp_class_sizes']} |"
        )
    write_text(os.path.join(args.out, "p3gm_labels.md"), "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
