"""Train the evaluation model on synthetic rows, score it on real test rows (seed 000, Table 2 protocol).

``train_and_score`` reports three figures on the real test rows, each named: the network alone (seed 000's Table 1
CNN, or the MLP for projections), the linear probe alone (``evaluation.probe``), and the model the recipe names (the
default ``stacked``: ``a * probe(x) + c * network(x)``, with its weights); and the same on the synthetic hold-out,
labelled as such. No real test row takes part in any choice. The recipe and the reasons for it: docs/evaluation.md
(the measurements behind them: benchmarks/results/README.md). The parts: ``recipes`` (``Recipe``, ``RECIPES``,
precision), ``targets`` (label scores as targets, the hold-out split), ``stacking`` (the probe beside the network),
``loop`` (one training run). Torch and numpy only: importable without Apache Beam.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Optional, Sequence

import numpy as np
import torch

from dpcda.evaluation.loop import effective_batch_size, predict, predict_logits, train_one
from dpcda.evaluation.models import RowScale, image_shape, make_model
from dpcda.evaluation.recipes import RECIPES, Recipe, cpu_has_bf16, kernel_path, recipe_name, same_training, use_bf16
from dpcda.evaluation.stacking import ProbeStart, Stacked, logit_scale, network_of, stack_shares, stack_weights
from dpcda.evaluation.targets import (
    as_tensors,
    score_moments,
    soft_targets,
    standardize_scores,
    stratified_split,
    target_loss,
)
from dpcda.mechanisms.device import pick_device  # one device policy for mixing and training
from dpcda.progress import track

# The names callers import from here (benchmarks, tests), wherever they live now.
__all__ = [
    "PROBE_DOMINATED",
    "PROBE_MARGIN",
    "RECIPES",
    "ProbeStart",
    "Recipe",
    "RowScale",
    "Stacked",
    "as_tensors",
    "cpu_has_bf16",
    "effective_batch_size",
    "kernel_path",
    "logit_scale",
    "network_name",
    "predict",
    "predict_logits",
    "recipe_name",
    "same_training",
    "soft_targets",
    "stack_weights",
    "standardize_scores",
    "stratified_split",
    "summary",
    "target_loss",
    "train_and_score",
    "train_one",
    "use_bf16",
]

PROBE_MARGIN = 0.02  # the network alone below the linear probe by more than this is called out in the summary
PROBE_DOMINATED = 0.1  # a stack whose network weighs less than this share of its output is called probe-dominated
REAL_TEST = "real test rows (the release's transform applied; outside the privacy guarantee)"
HOLDOUT = (
    "synthetic hold-out: a stratified share of the SYNTHETIC rows, scored against their released labels (not real "
    "rows; it weighs the stack, and the probe's fit saw these rows too)"
)


def network_name(model_class: str) -> str:
    """What reports call the network: "CNN" (seed 000's Table 1 network) or "MLP" (the projections' network)."""
    return {"TableOneCNN": "CNN", "TabularMLP": "MLP"}.get(model_class, model_class)


def _spread(values: list) -> dict:
    return {"accuracy_mean": float(np.mean(values)), "accuracy_std": float(np.std(values)), "accuracies": values}


def summary(real: dict) -> str:
    """One line for the report, the log and the CLI: the figure the recipe names, labelled, with the network alone and
    the probe alone beside it ("stacked: 0.7190 = CNN 0.7193, probe 0.6957, weights probe 0.31 / CNN 0.69"); a stack
    whose network weighs less than ``PROBE_DOMINATED`` says "probe-dominated", and a network alone more than
    ``PROBE_MARGIN`` below the probe is called out. ``real``: ``train_and_score``'s ``real_test_accuracy``."""
    kind, net, probe = real["headline"], real.get("network"), real.get("probe")
    p = probe["accuracy"] if probe else float("nan")
    name = net["name"] if net else "network"
    if kind == "stacked":
        s = real["stacked"]
        text = f"stacked: {s['accuracy_mean']:.4f} = {name} {net['accuracy_mean']:.4f}, probe {p:.4f}"
        w = s.get("weights")
        if w:
            text += f", weights probe {w['probe']:.2f} / {name} {w['network']:.2f}"
        if s.get("probe_dominated"):
            text += f" (probe-dominated: the {name} weighs less than {PROBE_DOMINATED:g})"
    elif kind == "probed":
        text = f"probed ({name} trained from the probe's map): {real['probed']['accuracy_mean']:.4f}, probe {p:.4f}"
    else:
        text = f"{name} alone: {net['accuracy_mean']:.4f}" + (f", probe {p:.4f}" if probe else "")
    text += " (real test rows)"
    if net and probe and math.isfinite(p):
        gap = p - net["accuracy_mean"]
        if gap > PROBE_MARGIN:
            text += (
                f"; the {name} alone is BELOW the linear probe by {gap:.4f} (more than {PROBE_MARGIN}): the release "
                f"carries signal the {name}'s training recipe does not reach"
            )
    return text


def _holdout_accuracy(logits: Optional[torch.Tensor], y: torch.Tensor) -> float:
    if logits is None or not len(y):
        return float("nan")
    return float((logits.argmax(dim=1) == y).float().mean())


def _score_run(trained, x_te, y_te, x_val, y_val, eval_batch: int, autocast: bool) -> dict:
    """The run's predictions on the real test rows (the recipe's model, and the network alone) and its figures on the
    synthetic hold-out: accuracies, and for a stack its raw weights and each part's share (``stack_shares``)."""
    pred = predict(trained, x_te, eval_batch, autocast)
    net = network_of(trained)
    out = {"pred": pred, "network_pred": None, "holdout": {}}
    if net is trained:
        out["network_pred"] = pred
    elif net is not None:
        out["network_pred"] = predict(net, x_te, eval_batch, autocast)
    if len(y_val):
        f = predict_logits(net, x_val, eval_batch, autocast) if net is not None else None
        if f is not None:
            out["holdout"]["network"] = _holdout_accuracy(f, y_val)
        if isinstance(trained, Stacked):
            z = trained.linear(x_val).float()
            f = f if f is not None else torch.zeros_like(z)
            out["holdout"]["model"] = _holdout_accuracy(trained.a * z + trained.c * f, y_val)
            out["shares"] = stack_shares(z, f, trained.a, trained.c)
        else:
            model_logits = f if net is trained else predict_logits(trained, x_val, eval_batch, autocast)
            out["holdout"]["model"] = _holdout_accuracy(model_logits, y_val)
    if isinstance(trained, Stacked):
        out["coefficients"] = {"probe": trained.a, "network": trained.c}
        out.setdefault("shares", None)
    return out


def train_and_score(
    train_x: np.ndarray,
    train_y: np.ndarray,
    test_x: np.ndarray,
    test_y: np.ndarray,
    *,
    num_classes: int,
    input_shape: Optional[Sequence[int]] = None,
    runs: int = 1,
    epochs: int = 10,
    device: str = "auto",
    seed: int = 0,
    progress: bool = True,
    recipe: Optional[Recipe] = None,
    track_test: bool = False,
    soft_labels: Optional[np.ndarray] = None,
    model: Optional[str] = None,
    probe: bool = True,
) -> dict:
    """Trains ``runs`` models (seeds ``seed .. seed+runs-1``) on synthetic rows and scores them on real rows.

    Model choice (the epoch kept, the stack's weights) uses only a held-out slice of the synthetic rows. ``soft_labels``
    (rows, K): the release's label scores, fitted as released (``recipe.soft_loss``); the hard labels are their argmax
    and serve the synthetic hold-out. ``model``: None (CNN for images, else the MLP), "cnn" or "mlp". ``track_test``
    adds a per-epoch real-test accuracy curve for diagnosis only; it never influences the model reported.
    ``progress``: training progress on stderr (``dpcda.progress``: a bar on a terminal, a line per tenth elsewhere).

    Returns the recipe's model's accuracy per run, mean and std (population, ddof=0; ``accuracy_*``, the headline),
    ``real_test_accuracy`` (the three figures, named: ``headline`` says which the recipe reports; ``network``, the
    network alone; ``probe``, the linear probe alone; ``stacked`` with its weights, or ``probed``),
    ``synthetic_holdout_accuracy`` (the same models on the synthetic hold-out), ``summary`` (one labelled line),
    per-class accuracy and confusion matrix of the headline model (mean over runs, rows = true class; each run's own
    counts sit in ``curves``), per-run curves, device, wall time."""
    if runs < 1 or epochs < 1:
        raise ValueError(f"runs and epochs must be >= 1, got runs={runs} epochs={epochs}")
    train_x, test_x = np.asarray(train_x), np.asarray(test_x)
    train_y, test_y = np.asarray(train_y, np.int64), np.asarray(test_y, np.int64)
    if train_x.ndim != 2 or test_x.ndim != 2 or train_x.shape[1] != test_x.shape[1]:
        raise ValueError(f"features must be (n, d) with the same d: train {train_x.shape}, test {test_x.shape}")
    if len(train_x) != len(train_y) or len(test_x) != len(test_y):
        raise ValueError("features and labels differ in length")
    for name, y in (("train", train_y), ("test", test_y)):
        if len(y) and (y.min() < 0 or y.max() >= num_classes):
            raise ValueError(f"{name} labels must lie in [0, {num_classes}); found {y.min()}..{y.max()}")
    recipe = recipe or Recipe()
    dim = train_x.shape[1]
    shape = tuple(input_shape) if input_shape is not None else dim
    resolved = image_shape(dim, shape if isinstance(shape, tuple) and len(shape) > 1 else None)
    dev = pick_device(device)
    t0 = time.time()
    tr_idx, val_idx = stratified_split(train_y, recipe.val_fraction, seed)
    x_tr, y_tr = as_tensors(train_x[tr_idx], train_y[tr_idx], dev)
    soft_tr = soft_val = None
    if soft_labels is not None:
        scores = np.asarray(soft_labels, np.float32)
        if scores.shape != (len(train_y), num_classes):
            raise ValueError(f"soft_labels must be (rows, {num_classes}), got {scores.shape}")
        if recipe.soft_loss == "clipped":
            scores = soft_targets(scores)
        elif recipe.soft_loss == "standardized":
            scores = standardize_scores(scores)
        soft_tr = torch.as_tensor(np.ascontiguousarray(scores[tr_idx])).to(dev)
        soft_val = torch.as_tensor(np.ascontiguousarray(scores[val_idx])).to(dev)
    x_val, y_val = as_tensors(train_x[val_idx], train_y[val_idx], dev)
    x_te, y_te = as_tensors(test_x, test_y, dev)
    selected = start = None
    if probe or recipe.probe_start or recipe.stack:
        from dpcda.evaluation.probe import released_targets, select_ridge

        selected = select_ridge(train_x, released_targets(train_y, soft_labels, num_classes), val_idx)
    if recipe.probe_start or recipe.stack:
        w, b = selected["whole"]  # the probe itself (its fit saw the hold-out too: a lean towards keeping it)
        if soft_labels is not None:
            if recipe.soft_loss != "standardized":
                raise ValueError(f"the probe fits label scores standardised, not soft_loss={recipe.soft_loss!r}")
            m, s = score_moments(soft_labels)  # the ridge fit of the standardised scores: the same map, rescaled
            w, b = w / s, (b - m) / s
        start = (w, b)
    bar = track(
        f"evaluate {runs}x{epochs} epochs on {dev.type}",
        runs * epochs * len(tr_idx),
        unit="rows",
        mode=None if progress else "off",
    )
    autocast = use_bf16(recipe, dev)
    accs, net_accs, scored_runs, curves, confusions = [], [], [], [], []
    try:
        for r in range(runs):
            trained, c = train_one(
                x_tr,
                y_tr,
                x_val,
                y_val,
                num_classes=num_classes,
                input_shape=shape,
                epochs=epochs,
                seed=seed + r,
                recipe=recipe,
                device=dev,
                progress=bar,
                test_x=x_te if track_test else None,
                test_y=y_te if track_test else None,
                train_soft=soft_tr,
                val_soft=soft_val,
                model_kind=model,
                start=start,
            )
            run = _score_run(trained, x_te, y_te, x_val, y_val, recipe.eval_batch, autocast)
            pred = run["pred"]
            pairs = (y_te * num_classes + pred).cpu().numpy()
            confusions.append(np.bincount(pairs, minlength=num_classes**2).reshape(num_classes, num_classes))
            accs.append(float((pred == y_te).float().mean()) if len(y_te) else float("nan"))
            if run["network_pred"] is not None:
                net_accs.append(float((run["network_pred"] == y_te).float().mean()) if len(y_te) else float("nan"))
            scored_runs.append(run)
            extra = {"network_accuracy": net_accs[-1] if run["network_pred"] is not None else None}
            extra["holdout_accuracy"] = run["holdout"]
            if "coefficients" in run:
                extra["stack_shares"] = run["shares"]
            curves.append(
                {"seed": seed + r, "accuracy": accs[-1], **c, **extra, "confusion_matrix": confusions[-1].tolist()}
            )
    finally:
        bar.close()
    probe_result = None
    if selected is not None:
        from dpcda.evaluation.probe import linear_probe

        probe_result = linear_probe(
            train_x, train_y, test_x, test_y, num_classes=num_classes, scores=soft_labels, selected=selected
        )
    model_class = type(make_model(shape, num_classes, kind=model)).__name__
    real, holdout = _figures(
        recipe, model_class, accs, net_accs, scored_runs, probe_result, selected, train_x, train_y, val_idx
    )
    # Mean over runs: sums to the number of test rows, and its diagonal over the row sums is the per-class
    # accuracy averaged over runs (every run sees the same test rows). Counts (ints) when runs == 1.
    confusion = np.mean(confusions, axis=0)
    row_sums = confusion.sum(axis=1)
    per_class = np.where(row_sums > 0, np.diag(confusion) / np.maximum(row_sums, 1), np.nan)
    confusion_out = confusion.astype(np.int64).tolist() if runs == 1 else np.round(confusion, 6).tolist()
    return {
        "summary": summary(real),
        "accuracy_mean": float(np.mean(accs)),
        "accuracy_std": float(np.std(accs)),
        "accuracies": accs,
        "accuracy_of": real["headline"],
        "real_test_accuracy": real,
        "synthetic_holdout_accuracy": holdout,
        "per_class_accuracy": [float(v) for v in per_class],
        "confusion_matrix": confusion_out,
        "curves": curves,
        "runs": runs,
        "epochs": epochs,
        "seeds": [seed + r for r in range(runs)],
        "model": model_class,
        "soft_labels": soft_labels is not None,
        "input_shape": list(resolved) if resolved else [dim],
        "recipe": dataclasses.asdict(recipe),
        "recipe_name": recipe_name(recipe),
        "probe": probe_result,
        "device": str(dev) if dev.type != "cuda" else f"cuda ({torch.cuda.get_device_name(dev)})",
        "kernel_path": kernel_path(recipe, str(dev)) if dev.type == "cpu" else None,
        "wall_seconds": time.time() - t0,
        "train_rows": int(len(tr_idx)),
        "val_rows": int(len(val_idx)),
        "test_rows": int(len(test_y)),
        "num_classes": num_classes,
    }


def _figures(recipe, model_class, accs, net_accs, runs, probe_result, selected, train_x, train_y, val_idx):
    """(``real_test_accuracy``, ``synthetic_holdout_accuracy``): the recipe's model, the network alone and the probe
    alone on each, named."""
    kind = "stacked" if recipe.stack else "probed" if recipe.probe_start else "network"
    name = network_name(model_class)
    real = {"headline": kind, "measured_on": REAL_TEST, "network": None, "probe": None}
    if len(net_accs) == len(accs):
        real["network"] = {"name": name, "model": model_class, **_spread(net_accs)}
    if probe_result is not None:
        real["probe"] = {"name": "linear probe", "accuracy": probe_result["accuracy"]}
    holdout = {"headline": kind, "measured_on": HOLDOUT, "rows": int(len(val_idx))}
    if len(val_idx):
        model_h = [r["holdout"]["model"] for r in runs]
        holdout[kind] = float(np.mean(model_h))
        if real["network"] is not None:
            holdout["network"] = float(np.mean([r["holdout"]["network"] for r in runs]))
        if selected is not None:
            w, b = selected["whole"]
            z = np.asarray(train_x[val_idx], np.float64) @ w + b
            holdout["probe"] = float((z.argmax(axis=1) == np.asarray(train_y)[val_idx]).mean())
    if kind == "stacked":
        shares = [r["shares"] for r in runs]
        mean = None
        if all(s is not None for s in shares):
            mean = {k: float(np.mean([s[k] for s in shares])) for k in ("probe", "network")}
        real["stacked"] = {
            **_spread(accs),
            "formula": "a * probe(x) + c * network(x), a, c >= 0 fitted on the synthetic hold-out",
            "weights": mean,
            "weights_are": "each part's share of the stacked output on the synthetic hold-out (stacking.stack_shares)",
            "coefficients": [r["coefficients"] for r in runs],
            "probe_dominated": mean is not None and mean["network"] < PROBE_DOMINATED,
        }
    elif kind == "probed":
        real["probed"] = {**_spread(accs), "formula": "s * probe(x) + network(x), trained from the probe's map"}
    return real, holdout
