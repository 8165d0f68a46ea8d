"""EvaluateUtility: train the Table 1 CNN on a release's synthetic rows, test on real rows (seed 000, Table 2).

The real test rows get exactly the transform the release applied to its training rows (``normalization.json``:
DP z-score then L2 clip, ``mechanisms.plan.normalize``); the synthetic rows are used as written. No real test
data takes part in any training choice (see ``evaluation.train``). Every report names three figures on the real test
rows: the network alone, the linear probe alone (``evaluation.probe``, fitted to the same released targets) and the
model the recipe names (by default the two stacked, with their weights), and the same models on the synthetic
hold-out, labelled as such; a one-line summary says which is the headline. Beam is not needed for local paths.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from typing import Optional

import numpy as np

from dpcda.evaluation import report as report_mod
from dpcda.evaluation.train import train_and_score
from dpcda.mechanisms import registry
from dpcda.mechanisms.plan import normalize
from dpcda.privacy.errors import DpcdaError
from dpcda.storage.paths import exists as _exists
from dpcda.storage.paths import expand_glob, is_remote, open_file
from dpcda.storage.paths import join as _join
from dpcda.storage.shards import InputError, read_all

log = logging.getLogger("dpcda.evaluation")
EVAL_DIR = "evaluation"
SYNTHETIC_DIR = "synthetic"
NORMALIZATION = "normalization.json"


class EvaluationError(DpcdaError, ValueError):
    """The release or the test data cannot be evaluated (missing files, mismatched widths or labels)."""


def _read_json(path: str) -> dict:
    with open_file(path) as fh:
        return json.loads(fh.read())


def load_synthetic(release_dir: str, manifest: Optional[dict] = None):
    """Every synthetic row of a release: the manifest's files, else ``release_dir/synthetic/*.parquet`` (or Parquet
    files in the folder)."""
    listed = (manifest or {}).get("output", {}).get("files")
    if listed:
        return read_all([_join(release_dir, f["path"]) for f in listed], "parquet")
    files = expand_glob(_join(release_dir, SYNTHETIC_DIR, "*.parquet")) or expand_glob(_join(release_dir, "*.parquet"))
    if not files:
        raise EvaluationError(f"{release_dir}: no synthetic Parquet files (expected {SYNTHETIC_DIR}/part-*.parquet)")
    return read_all(files, "parquet")


def load_soft_labels(release_dir: str, manifest: Optional[dict]) -> Optional[np.ndarray]:
    """The released label scores (``LABEL_soft``), in the order ``load_synthetic`` reads the rows, or None."""
    import pyarrow.parquet as pq

    listed = (manifest or {}).get("output", {}).get("files")
    label = (manifest or {}).get("input", {}).get("label_column", "label")
    if not listed:
        return None
    parts = []
    for f in listed:
        with open_file(_join(release_dir, f["path"])) as fh:
            table = pq.read_table(fh)
        if f"{label}_soft" not in table.column_names:
            return None
        col = table.column(f"{label}_soft").combine_chunks()
        parts.append(col.flatten().to_numpy(zero_copy_only=False).reshape(len(col), -1))
    return np.concatenate(parts).astype(np.float32)


def load_test(test_glob: str, norm: dict, dim: int, projection: Optional[np.ndarray] = None):
    """Real test rows, normalised as the release normalised its training rows (and projected by the release's
    public R for random projection)."""
    files = expand_glob(test_glob)
    if not files:
        raise InputError(f"{test_glob}: no test files match")
    block = read_all(files)
    width = block.features.shape[1]
    if (projection is None and width != dim) or (projection is not None and width != projection.shape[0]):
        raise EvaluationError(
            f"{test_glob}: test rows have width {width}, the release has "
            f"{dim if projection is None else projection.shape[0]}"
        )
    mean, std = (np.asarray(norm[k], np.float32) for k in ("mean", "std"))
    if mean.shape != (width,) or std.shape != (width,):
        raise EvaluationError(f"{NORMALIZATION}: mean/std must list {width} numbers")
    x = normalize(block.features, mean, std, float(norm["clip"]), tuple(norm["feature_bounds"]))
    if projection is not None:
        x = (x.astype(np.float64) @ projection).astype(np.float32)
    return x, block.labels


def _find_normalization(release_dir: str, manifest: Optional[dict] = None) -> str:
    listed = (manifest or {}).get("normalization", {}).get("statistics_file")
    if listed and _exists(_join(release_dir, listed)):
        return _join(release_dir, listed)
    for d in (release_dir, os.path.dirname(release_dir.rstrip("/"))):
        path = _join(d, NORMALIZATION)
        if d and _exists(path):
            return path
    raise EvaluationError(
        f"{release_dir}: {NORMALIZATION} is missing; the test rows cannot be normalised as "
        f"the release's training rows were"
    )


def class_names(manifest: Optional[dict], test_glob: str, num_classes: int) -> tuple[Optional[list], Optional[str]]:
    """(names, where from) for the sample grid's rows: the release's label decoding where its manifest has one (a
    table release's ``input.table.label.categories``, class k at k), else the class names ``dpcda prepare`` recorded
    beside the test split's shards (``storage.prepared.label_names``: Fashion-MNIST's ten), else (None, None). Names
    of another length than the release's classes are not used."""
    from dpcda.storage import prepared

    label = (((manifest or {}).get("input") or {}).get("table") or {}).get("label") or {}
    cats = label.get("categories")
    if isinstance(cats, list) and len(cats) == num_classes:
        return [str(c) for c in cats], "the release's label decoding (input.table.label.categories)"
    files = [] if is_remote(test_glob) else expand_glob(test_glob)
    dirs = {os.path.dirname(f) for f in files}
    if len(dirs) == 1:
        names = prepared.label_names(dirs.pop())
        if names is not None and len(names) == num_classes:
            return names, f"the class names dpcda prepare recorded beside the test split ({prepared.MARKER})"
    return None, None


def _release_info(manifest: Optional[dict]) -> dict:
    if not manifest:
        return {}
    mech, priv = manifest.get("mechanism", {}), manifest.get("privacy", {})
    return {
        "release": {
            "mode": mech.get("mode"),
            "mixing_order": mech.get("mixing_order"),
            "sigma_x": mech.get("sigma_x"),
            "clip": mech.get("clip"),
            "epsilon": priv.get("epsilon"),
            "delta": priv.get("delta"),
            "samples_total": mech.get("samples_total"),
        }
    }


def run_evaluation(
    release_dir: str,
    test_glob: str,
    out_dir: str,
    *,
    runs: int,
    epochs: int,
    manifest: Optional[dict] = None,
    device: str = "auto",
    seed: int = 0,
    progress: bool = True,
) -> dict:
    """Loads, trains ``runs`` x ``epochs``, writes report.json, samples.png, curves.png into ``out_dir``."""
    syn = load_synthetic(release_dir, manifest)
    dim = syn.features.shape[1]
    norm = _read_json(_find_normalization(release_dir, manifest))
    mech = (manifest or {}).get("mechanism", {})
    entry = registry.get(mech["name"]) if mech.get("name") else None
    projection = entry.test_projection(manifest) if entry else None  # randproj: the public R, rebuilt from the manifest
    test_x, test_y = load_test(test_glob, norm, dim, projection)
    soft = load_soft_labels(release_dir, manifest) if entry and entry.label_scores else None
    declared = (manifest or {}).get("mechanism", {}).get("num_classes")
    num_classes = int(declared or max(int(syn.labels.max()), int(test_y.max())) + 1)
    if int(test_y.max()) >= num_classes or int(test_y.min()) < 0:
        raise EvaluationError(f"{test_glob}: a test label falls outside the release's {num_classes} classes")
    log.info(
        "stage=evaluate synthetic=%d test=%d dim=%d classes=%d runs=%d epochs=%d",
        len(syn.labels),
        len(test_y),
        dim,
        num_classes,
        runs,
        epochs,
    )
    result = train_and_score(
        syn.features,
        syn.labels,
        test_x,
        test_y,
        num_classes=num_classes,
        runs=runs,
        epochs=epochs,
        device=device,
        seed=seed,
        progress=progress,
        soft_labels=soft,
        model="mlp" if projection is not None else None,
    )
    names, names_from = class_names(manifest, test_glob, num_classes)
    extra = {"synthetic_rows": int(len(syn.labels)), "test_glob": test_glob, **_release_info(manifest)}
    if names is not None:
        extra.update(class_names=names, class_names_from=names_from)
    remote = is_remote(out_dir)
    local_dir = tempfile.mkdtemp(prefix="dpcda-eval-") if remote else out_dir
    try:
        paths = report_mod.write_all(
            local_dir,
            result,
            syn.features,
            syn.labels,
            input_shape=result["input_shape"],
            extra=extra,
            norm=norm if projection is None else None,  # projected rows have no input units to show
            class_names=names,
        )
        if remote:
            for p in paths.values():
                with open(p, "rb") as src, open_file(_join(out_dir, os.path.basename(p)), "wb") as dst:
                    dst.write(src.read())
    finally:
        if remote:
            shutil.rmtree(local_dir, ignore_errors=True)
    log.info(
        "stage=evaluate real_test_accuracy %s device=%s seconds=%.1f",
        _fields(result),
        result["device"],
        result["wall_seconds"],
    )
    log.info("stage=evaluate synthetic_holdout_accuracy %s", _fields(result, holdout=True))
    log.info("stage=evaluate summary=%s", result["summary"])
    return {**result, **extra, "path": _join(out_dir, report_mod.REPORT)}


def _fields(result: dict, holdout: bool = False) -> str:
    """``stacked=0.7190+-0.0011 cnn=0.7193 probe=0.6957 cnn_weight=0.69``: the recipe's figure first, then the network
    alone and the probe alone, each named (on the synthetic hold-out with ``holdout``, and its row count)."""
    real = result["real_test_accuracy"]
    kind, net = real["headline"], real.get("network")
    name = (net or {}).get("name", "network").lower()
    if holdout:
        h = result["synthetic_holdout_accuracy"]
        keys = [(kind, kind)] + [(k, label) for k, label in (("network", name), ("probe", "probe")) if k != kind]
        return " ".join(f"{label}={h[k]:.4f}" for k, label in keys if k in h) + f" rows={h['rows']}"
    parts = [f"{kind if kind != 'network' else name}={result['accuracy_mean']:.4f}+-{result['accuracy_std']:.4f}"]
    if net is not None and kind != "network":
        parts.append(f"{name}={net['accuracy_mean']:.4f}")
    if real.get("probe"):
        parts.append(f"probe={real['probe']['accuracy']:.4f}")
    weights = (real.get("stacked") or {}).get("weights")
    if weights:
        parts.append(f"{name}_weight={weights['network']:.2f}")
    return " ".join(parts)


TEST_DATA_NOTE = (
    "accuracy on real test rows: a statistic of the test set, which the privacy guarantee does not "
    "cover (it covers the release's input records); publish it only if the test set is public"
)


def evaluate_release(
    workdir: str, manifest: dict, test_glob: str, *, runs: int = 1, epochs: int = 10, test_public: bool = False
) -> dict:
    """Release stage: evaluates the run directory ``workdir`` (not yet published); returns the ``utility`` section.
    ``manifest``: the manifest so far as JSON (``Manifest.model_dump(mode="json")``).

    Unless ``test_public``, the section says that its figures are outside the guarantee and leaves out the exact
    test row count. Its report path is relative to OUTPUT, like the manifest's files.
    """
    draft_files = {
        **manifest,
        "output": {
            **manifest["output"],
            "files": [
                {**f, "path": f["path"][len(manifest["output"].get("prefix", "")) :]}
                for f in manifest["output"]["files"]
            ],
        },
    }
    rep = run_evaluation(
        workdir,
        test_glob,
        _join(workdir, EVAL_DIR),
        runs=runs,
        epochs=epochs,
        manifest={**draft_files, "normalization": {}},
    )
    return {
        "accuracy_mean": rep["accuracy_mean"],
        "accuracy_std": rep["accuracy_std"],
        "runs": rep["runs"],
        "epochs": rep["epochs"],
        "device": rep["device"],
        "accuracy_of": rep["accuracy_of"],
        "network_accuracy": (rep["real_test_accuracy"]["network"] or {}).get("accuracy_mean"),
        "probe_accuracy": rep["probe"]["accuracy"] if rep.get("probe") else None,
        "stack_weights": (rep["real_test_accuracy"].get("stacked") or {}).get("weights"),
        "synthetic_holdout_accuracy": {
            k: v for k, v in rep["synthetic_holdout_accuracy"].items() if k not in ("measured_on", "headline")
        },
        "recipe": rep["recipe_name"],
        "summary": rep["summary"],
        "report": f"{manifest['output'].get('prefix', '')}{EVAL_DIR}/{report_mod.REPORT}",
        "test_set_public": test_public,
        **({"test_rows": rep["test_rows"]} if test_public else {"outside_guarantee": TEST_DATA_NOTE}),
    }
