"""Evaluation outputs: ``report.json``, ``samples.png`` (seed 000 Fig. 1 style grid) and ``curves.png``.

Matplotlib with the Agg backend (no display); local paths only.
"""

from __future__ import annotations

import json
import math
import os
from typing import Optional, Sequence

import numpy as np

REPORT = "report.json"
SAMPLES = "samples.png"
CURVES = "curves.png"


def named_headline(report: dict) -> dict:
    """What a printed summary puts beside ``accuracy``: which model that figure is (``accuracy_of``: stacked, network
    or probed) and the one labelled line naming the network alone and the probe alone (``summary``), where the report
    has them (a table release's does not)."""
    return {k: report[k] for k in ("accuracy_of", "summary") if k in report}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def write_report(out_dir: str, result: dict, extra: Optional[dict] = None) -> str:
    """Writes ``out_dir/report.json`` (the ``train_and_score`` result plus ``extra``); returns its path."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, REPORT)
    body = {**result, **(extra or {})}
    tmp = path + ".partial"
    with open(tmp, "w") as fh:
        fh.write(json.dumps(body, indent=2, allow_nan=True) + "\n")
    os.replace(tmp, path)
    return path


def _as_image(row: np.ndarray, shape: Optional[Sequence[int]]) -> np.ndarray:
    """A row as a displayable 2-D (H, W) or (H, W, 3) array; flat rows become a near-square strip."""
    if shape is not None and len(shape) == 3:
        c, h, w = shape
        img = row.reshape(c, h, w)
        return img[0] if c == 1 else np.moveaxis(img[:3], 0, -1) if c >= 3 else img.mean(axis=0)
    d = row.size
    side = math.isqrt(d)
    if side * side == d:
        return row.reshape(side, side)
    width = math.ceil(math.sqrt(d))
    return np.pad(row, (0, width * math.ceil(d / width) - d), constant_values=np.nan).reshape(-1, width)


def to_pixels(rows: np.ndarray, norm: dict) -> np.ndarray:
    """Released rows (z-scored, scaled to L2 norm at most c) shown in the input's units: mean + std * row * sqrt(d) / c,
    cut to the feature bounds. sqrt(d) is the norm a z-scored row has on average (d coordinates of unit variance), a
    public display scale; the statistics are the release's own (``normalization.json``). Post-processing only."""
    rows = np.asarray(rows, np.float64)
    mean, std = (np.asarray(norm[k], np.float64) for k in ("mean", "std"))
    lo, hi = norm["feature_bounds"]
    return np.clip(mean + std * rows * (math.sqrt(rows.shape[-1]) / float(norm["clip"])), lo, hi)


def write_samples(
    path: str,
    features: np.ndarray,
    labels: np.ndarray,
    *,
    num_classes: int,
    per_class: int = 8,
    input_shape: Optional[Sequence[int]] = None,
    seed: int = 0,
    class_names: Optional[Sequence[str]] = None,
    norm: Optional[dict] = None,
) -> str:
    """Grid of synthetic rows (seed 000 Fig. 1): one row per class, its mean over all its synthetic rows
    first (noise averages out there; post-processing of released rows only), then ``per_class`` samples. Each row is
    labelled "k: name" with ``class_names`` (the release's label decoding), else "class k".

    ``norm`` (the release's normalization: mean, std, clip, feature_bounds): rows are drawn in the input's units
    (``to_pixels``) on the bounds' fixed grey scale. Without it each image is drawn as released, z-scored, on its own
    grey scale, where the near-constant border pixels (tiny std) dominate."""
    plt = _pyplot()
    if norm is not None:
        features = to_pixels(features, norm)
    rng = np.random.default_rng(seed)
    cols = per_class + 1
    fig, axes = plt.subplots(num_classes, cols, figsize=(cols * 0.9 + 0.8, num_classes * 0.9 + 0.4), squeeze=False)
    for k in range(num_classes):
        rows = np.flatnonzero(labels == k)
        pick = rng.choice(rows, size=min(per_class, len(rows)), replace=False) if len(rows) else []
        shown = ([features[rows].mean(axis=0)] if len(rows) else []) + [features[i] for i in pick]
        for j in range(cols):
            ax = axes[k, j]
            ax.set_xticks([])
            ax.set_yticks([])
            for spine in ax.spines.values():
                spine.set_visible(False)
            if j < len(shown):
                img = _as_image(np.asarray(shown[j], np.float32), input_shape)
                scale = {}
                if norm is not None:  # bounds to [0, 1], one scale for every image (RGB ignores vmin/vmax)
                    lo, hi = norm["feature_bounds"]
                    img = (img - lo) / (hi - lo)
                    scale = dict(vmin=0.0, vmax=1.0)
                elif img.ndim == 3:  # colour: each image scaled to [0, 1] for display
                    lo, hi = np.nanmin(img), np.nanmax(img)
                    img = (img - lo) / (hi - lo + 1e-12)
                ax.imshow(img, cmap="gray", interpolation="nearest", **scale)
            if k == 0:
                ax.set_title("class mean" if j == 0 else f"sample {j}", fontsize=7)
            if j == 0:
                ax.set_ylabel(
                    f"{k}: {class_names[k]}" if class_names else f"class {k}",
                    rotation=0,
                    ha="right",
                    va="center",
                    fontsize=8,
                )
    fig.suptitle(
        "synthetic rows per class" + (" (input units: mean + std x row x sqrt(d) / c)" if norm is not None else ""),
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=80, bbox_inches="tight")
    plt.close(fig)
    return path


def real_test_line(result: dict) -> str:
    """The real-test figures of a ``train_and_score`` result in a few words, each named: "real test rows: stacked
    0.7190 = CNN alone 0.7193, probe alone 0.6957; weights probe 0.31 / CNN 0.69"."""
    real = result.get("real_test_accuracy") or {}
    kind, net, probe = real.get("headline", "model"), real.get("network"), real.get("probe")
    name = net["name"] if net else "network"
    head = {"stacked": "stacked (probe + " + name + ")", "network": name + " alone"}.get(kind, kind)
    parts = [f"{head} {result['accuracy_mean']:.4f}"]
    if net and kind != "network":
        parts.append(f"{name} alone {net['accuracy_mean']:.4f}")
    if probe:
        parts.append(f"probe alone {probe['accuracy']:.4f}")
    text = "real test rows: " + ", ".join(parts)
    weights = (real.get("stacked") or {}).get("weights")
    if weights:
        text += f"; weights probe {weights['probe']:.2f} / {name} {weights['network']:.2f}"
        if real["stacked"].get("probe_dominated"):
            text += " (probe-dominated)"
    return text


def write_curves(path: str, curves: list[dict], result: Optional[dict] = None) -> str:
    """Training loss and the synthetic hold-out's accuracy per epoch, one line per run; with ``result`` (the
    ``train_and_score`` result) the hold-out's figures of the stack and the probe at the end, and the real-test
    figures under the plots, each named, so the two are never read for one another."""
    plt = _pyplot()
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 4.2))
    real = (result or {}).get("real_test_accuracy") or {}
    name = (real.get("network") or {}).get("name", "network")
    for c in curves:
        epochs = np.arange(1, len(c["train_loss"]) + 1)
        label = f"seed {c.get('seed', '?')}"
        ax_loss.plot(epochs, c["train_loss"], marker="o", label=label)
        (line,) = ax_acc.plot(epochs, c["val_accuracy"], marker="o", label=f"{name}, {label}")
        sel = c.get("selected_epoch")
        if sel is not None and 0 <= sel < len(c["val_accuracy"]):
            ax_acc.plot([sel + 1], [c["val_accuracy"][sel]], marker="*", markersize=12, color=line.get_color())
        model = (c.get("holdout_accuracy") or {}).get("model")
        if model is not None and real.get("headline") not in (None, "network") and len(epochs):
            ax_acc.plot(
                [epochs[-1] + 0.15],
                [model],
                marker="D",
                color=line.get_color(),
                linestyle="none",
                label=f"{real['headline']}, {label} (kept)",
            )
    probe_h = ((result or {}).get("synthetic_holdout_accuracy") or {}).get("probe")
    if probe_h is not None:
        ax_acc.axhline(probe_h, color="grey", ls="--", lw=1, label="linear probe (hold-out)")
    ax_loss.set(title="training loss on the synthetic rows", xlabel="epoch", ylabel="loss (the recipe's)")
    ax_acc.set(
        title="accuracy on the SYNTHETIC hold-out\n(10 % of the synthetic rows, not the real test rows; * = kept)",
        xlabel="epoch",
        ylabel="synthetic hold-out accuracy",
    )
    for ax in (ax_loss, ax_acc):
        ax.grid(alpha=0.3)
        ax.xaxis.get_major_locator().set_params(integer=True)
        if len(curves) <= 10:
            ax.legend(fontsize=7)
    ax_loss.title.set_fontsize(10)
    ax_acc.title.set_fontsize(10)
    if result is not None and "accuracy_mean" in result:
        import textwrap

        fig.text(
            0.5,
            0.01,
            "\n".join(textwrap.wrap(real_test_line(result), 120)),
            ha="center",
            va="bottom",
            fontsize=9,
            fontweight="bold",
        )
        fig.tight_layout(rect=(0, 0.07, 1, 1))
    else:
        fig.tight_layout()
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)
    return path


def write_all(
    out_dir: str,
    result: dict,
    train_x: np.ndarray,
    train_y: np.ndarray,
    *,
    input_shape: Optional[Sequence[int]] = None,
    extra: Optional[dict] = None,
    norm: Optional[dict] = None,
    class_names: Optional[Sequence[str]] = None,
) -> dict:
    """Writes report.json, samples.png and curves.png into ``out_dir``; returns their paths. ``norm`` and
    ``class_names``: as ``write_samples``'s."""
    os.makedirs(out_dir, exist_ok=True)
    shape = input_shape if input_shape is not None and len(input_shape) == 3 else None
    paths = {
        "samples": write_samples(
            os.path.join(out_dir, SAMPLES),
            train_x,
            train_y,
            num_classes=result["num_classes"],
            input_shape=shape,
            norm=norm,
            class_names=class_names,
        ),
        "curves": write_curves(os.path.join(out_dir, CURVES), result["curves"], result),
    }
    paths["report"] = write_report(
        out_dir, result, {**(extra or {}), "files": {k: os.path.basename(v) for k, v in paths.items()}}
    )
    return paths
