"""``dpcda evaluate``: a release folder evaluated after the fact, image rows (``evaluation.stage``) or a table
(``evaluation.tabular``), whichever its manifest says (this module imports both; neither imports the other)."""

from __future__ import annotations

from typing import Optional

from dpcda.evaluation.stage import EVAL_DIR, _exists, _join, _read_json, run_evaluation
from dpcda.evaluation.tabular import evaluate_table_dir


def evaluate_standalone(
    synthetic_dir: str, test_glob: str, *, runs: int = 3, epochs: int = 10, out: Optional[str] = None, seed: int = 0
) -> dict:
    """``dpcda evaluate``: evaluates a release folder; returns the report dict with 'path' (report.json)."""
    from dpcda.storage.publish import MANIFEST

    manifest_path = _join(synthetic_dir, MANIFEST)
    manifest = _read_json(manifest_path) if _exists(manifest_path) else None
    if manifest and (manifest.get("input") or {}).get("table"):
        return evaluate_table_dir(synthetic_dir, manifest, test_glob, out or _join(synthetic_dir, EVAL_DIR), seed)
    return run_evaluation(
        synthetic_dir,
        test_glob,
        out or _join(synthetic_dir, EVAL_DIR),
        runs=runs,
        epochs=epochs,
        manifest=manifest,
        seed=seed,
    )
