"""One cell, one release, one training: a quick screen of a release setting (used to choose --lowpass K).

    python -m benchmarks.studies.screen_cell --l 4 --lowpass 16 [--T 60000] [--epochs 5] [--seed 0] [--track]

Prints one JSON line: the setting, sigma_x, the real-test accuracy of the kept model, the per-epoch accuracy on the
synthetic hold-out (``val``) and, with ``--track``, on the real test split (``test``; informational, it never picks
the model). Same cores as ``benchmarks.reproduce.reproduce_table2`` (DP normalisation, the Calibrate stage, per-class
mixing, the evaluation CNN), through its ``synthesize``; ``--T`` sets the number of synthetic rows
(``ReleaseConfig.samples``).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from benchmarks.reproduce.reproduce_table2 import synthesize
from dpcda.evaluation.train import train_and_score
from dpcda.mechanisms.combiners import FirstPassCombiner
from dpcda.mechanisms.plan import normalize
from dpcda.pipeline.prepare import FASHION_MNIST_DIR, load_fashion_mnist


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--l", type=int, default=4)
    ap.add_argument("--T", type=int, default=60000)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eps", type=float, default=10.0)
    ap.add_argument("--mode", default="fixed", choices=["fixed", "poisson"])
    ap.add_argument("--lowpass", type=int, default=None)
    ap.add_argument("--track", action="store_true")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--source", default=FASHION_MNIST_DIR)
    ap.add_argument("--limit", type=int, default=None, help="first N training rows")
    a = ap.parse_args(argv)
    x, y = load_fashion_mnist("train", a.source)
    if a.limit:
        x, y = x[: a.limit], y[: a.limit]
    tx, ty = load_fashion_mnist("test", a.source)
    comb = FirstPassCombiner((0.0, 1.0))
    first = comb.add(comb.create(), x, y)
    t = time.time()
    calibration = a.mode + (f"+lp{a.lowpass}" if a.lowpass else "")
    feats, labels, plan = synthesize(
        x,
        y,
        first,
        calibration=calibration,
        eps=repr(a.eps),
        l=a.l,
        seed=a.seed,
        device=torch.device(a.device),
        samples=a.T,
    )
    test = normalize(tx, plan.mean, plan.std, plan.clip, plan.bounds)
    t1 = time.time()
    res = train_and_score(
        feats,
        labels,
        test,
        ty,
        num_classes=10,
        input_shape=(1, 28, 28),
        runs=1,
        epochs=a.epochs,
        device=a.device,
        seed=a.seed * 1000,
        progress=False,
        track_test=a.track,
    )
    curve = res["curves"][0]
    print(
        json.dumps(
            {
                **vars(a),
                "sigma_x": plan.synthesis.sigma_x,
                "accuracy": res["accuracy_mean"],
                "synth_s": round(t1 - t, 1),
                "train_s": round(time.time() - t1, 1),
                "selected_epoch": curve["selected_epoch"],
                "val": curve["val_accuracy"],
                "test": curve.get("test_accuracy"),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
