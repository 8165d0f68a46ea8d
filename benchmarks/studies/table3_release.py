"""One release of a Table 3 cell, re-created and trained with one or more recipes: the CNN's curves beside its probe.

    python -m benchmarks.studies.table3_release --variant dpmix/plain --eps 20 --l 64 --release 1 --recipes new scaled
    python -m benchmarks.studies.table3_release --variant local/plain --eps 10 --l 1 --set lr=3e-4   # a recipe change

The release is the one ``benchmarks.reproduce.reproduce_table3`` draws for that cell (release 0 is the l-search
release, seed ``crc32(dataset/mechanism/variant/eps) % 10^6 + l + 1000 r``), built by the same code
(``reproduce_table3.release_and_train``) and trained with the same training seed unless
``--training-seed`` is given. Prints one line per recipe: real-test accuracy of the recipe's model, of the network
alone and of the linear probe, the stack's weights, the same models on the synthetic hold-out, and per epoch the
training loss, the synthetic hold-out's score and the real-test accuracy (informational: it picks nothing). The
thread count (``OMP_NUM_THREADS``) is printed, because the training's floating-point sums depend on it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import torch

from benchmarks.reproduce.reproduce_table3 import VARIANTS, cell_release, load
from dpcda.evaluation.train import RECIPES, Recipe
from dpcda.mechanisms.inprocess import first_pass
from dpcda.pipeline.prepare import FASHION_MNIST_DIR


def recipe_changes(items) -> dict:
    """``FIELD=VALUE`` strings as ``Recipe`` field changes, each value parsed as the field's default's type (``none``:
    None); an unknown field or a bad value is a one-line error."""
    fields = {f.name: f for f in dataclasses.fields(Recipe)}
    out = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or name not in fields:
            raise SystemExit(f"--set: {item!r} is not FIELD=VALUE with FIELD one of {sorted(fields)}")
        default = fields[name].default
        if text.lower() == "none":
            out[name] = None
        elif isinstance(default, bool):
            out[name] = text.lower() in ("1", "true", "yes")
        else:
            kind = type(default) if default is not None else float
            try:
                out[name] = kind(text)
            except ValueError:
                raise SystemExit(f"--set: {name}={text!r} is not a {kind.__name__}") from None
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="fashion-mnist", choices=["fashion-mnist", "digits"])
    ap.add_argument("--variant", default="dpmix/plain", choices=[f"{m}/{v}" for m, v, _ in VARIANTS])
    ap.add_argument("--eps", default="20")
    ap.add_argument("--l", type=int, default=64)
    ap.add_argument("--release", type=int, default=1, help="release index r of the cell (0: the l-search release)")
    ap.add_argument("--recipes", nargs="+", default=["stacked"], choices=list(RECIPES))
    ap.add_argument("--training-seed", type=int, default=None, help="default: the release's seed, as Table 3")
    ap.add_argument("--epochs", type=int, default=None, help="(default: Table 3's, 5 on Fashion-MNIST, 20 on digits)")
    ap.add_argument(
        "--set",
        nargs="+",
        default=[],
        metavar="FIELD=VALUE",
        help="change recipe fields for this run (e.g. lr=3e-4 batch_size=1024 dropout=none): a study, not a recipe",
    )
    ap.add_argument("--source", default=FASHION_MNIST_DIR)
    args = ap.parse_args(argv)
    x, y, tx, ty, lowpass = load(args.dataset, args.source)
    data = (x, y, tx, ty, first_pass(x, y), lowpass)
    changes = recipe_changes(args.set)
    for name in args.recipes:
        t0 = time.time()
        got, seed, l = cell_release(
            data,
            args.dataset,
            args.variant,
            args.eps,
            args.l,
            args.release,
            args.epochs,
            recipe=dataclasses.replace(RECIPES[name], **changes),
            training_seed=args.training_seed,
            track_test=True,
        )
        if got is None:
            raise SystemExit(f"{args.variant} does not apply to {args.dataset}'s rows")
        res = got[0]
        c, net = res["curves"][0], res["real_test_accuracy"]["network"]
        print(
            json.dumps(
                {
                    "cell": f"{args.dataset} {args.variant} eps {args.eps} l {l}",
                    "release": args.release,
                    "release_seed": seed,
                    "training_seed": res["seeds"][0],
                    "recipe": name + "".join(f" {k}={v}" for k, v in changes.items()),
                    "accuracy": round(res["accuracy_mean"], 4),
                    "accuracy_of": res["accuracy_of"],
                    "network_alone": round(net["accuracy_mean"], 4) if net else None,
                    "selected_epoch": c["selected_epoch"],
                    "probe": round(res["probe"]["accuracy"], 4),
                    "stack_weights": (res["real_test_accuracy"].get("stacked") or {}).get("weights"),
                    "synthetic_holdout_accuracy": {
                        k: round(v, 4) for k, v in res["synthetic_holdout_accuracy"].items() if isinstance(v, float)
                    },
                    "train_loss": [round(v, 5) for v in c["train_loss"]],
                    "val_score": [round(v, 5) for v in c["val_score"]],
                    "test_accuracy": [round(v, 4) for v in c["test_accuracy"]],
                    "per_class_accuracy": [round(v, 3) for v in res["per_class_accuracy"]],
                    "threads": torch.get_num_threads(),
                    "precision": (res["kernel_path"] or {}).get("precision"),
                    "seconds": round(time.time() - t0),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
