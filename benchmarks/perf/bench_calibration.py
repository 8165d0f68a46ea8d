"""Calibration time of the plan's lone Gaussian shares (``privacy.calibration.calibrate_gaussian``) and their noise.

    python -m benchmarks.perf.bench_calibration                       # this tree
    python -m benchmarks.perf.bench_calibration --compare-to REV      # this tree beside git revision REV, alternating

Each target is one share a release calibrates alone before the mechanism's own noise (normalization statistics,
class histogram, DP-PCA covariance): a Gaussian of sensitivity 1 spending ``target`` at delta 1e-5 under the PLD
accountant. Each tree runs in its own process (``python -c``), so import time is not counted; the table gives the
seconds of each call and the noise multiplier z it returned, which two trees should agree on within the search
tolerance (0.1 % in z).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from benchmarks.paired import HERE, revision_tree

TARGETS = (0.01, 0.1, 0.5, 1.0, 3.0, 30.0)
DELTA = 1e-5

_CHILD = r"""
import json, sys, time
from dpcda.privacy.calibration import calibrate_gaussian
out = []
for target in json.loads(sys.argv[1]):
    t = time.perf_counter()
    ev = calibrate_gaussian("poisson", name="share", sensitivity=1.0, target_epsilon=target, delta=float(sys.argv[2]))
    out.append((time.perf_counter() - t, ev.noise_multiplier))
print(json.dumps(out))
"""


def run_tree(tree: str, targets, delta: float) -> list[tuple[float, float]]:
    """[(seconds, z)] per target, calibrated by the code of ``tree`` in a fresh process."""
    res = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(list(targets)), repr(delta)],
        cwd=tree,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": tree},
    )
    return [tuple(r) for r in json.loads(res.stdout.strip().splitlines()[-1])]


def table(results: dict[str, list[list[tuple[float, float]]]], targets) -> str:
    """Markdown: per target, each tree's mean seconds over repeats and its z."""
    names = list(results)
    head = "| target eps | " + " | ".join(f"{n}: s | {n}: z" for n in names) + " |"
    rule = "|---:|" + "---:|---:|" * len(names)
    lines = [head, rule]
    for i, target in enumerate(targets):
        cells = []
        for n in names:
            runs = results[n]
            secs = sum(r[i][0] for r in runs) / len(runs)
            cells += [f"{secs:.3f}", f"{runs[0][i][1]:.6g}"]
        lines.append(f"| {target:g} | " + " | ".join(cells) + " |")
    totals = [sum(sum(r[i][0] for i in range(len(targets))) for r in results[n]) / len(results[n]) for n in names]
    lines.append("| all | " + " | ".join(f"{t:.2f} | " for t in totals) + " |")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", type=float, nargs="+", default=list(TARGETS))
    ap.add_argument("--delta", type=float, default=DELTA)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--compare-to", metavar="REV", help="git revision to time against, alternating with this tree")
    args = ap.parse_args(argv)
    results: dict[str, list] = {}
    if args.compare_to:
        with revision_tree(args.compare_to, "bench-calibration-") as (ref_tree, _tmp):
            for _ in range(args.repeats):
                for name, tree in ((args.compare_to, ref_tree), ("this tree", HERE)):
                    results.setdefault(name, []).append(run_tree(tree, args.targets, args.delta))
                    print(f"{name}: done", file=sys.stderr, flush=True)
    else:
        for _ in range(args.repeats):
            results.setdefault("this tree", []).append(run_tree(HERE, args.targets, args.delta))
    print(
        f"\nLone Gaussian share calibrated to (target, {args.delta:g}) by the PLD accountant, sensitivity 1; "
        f"{os.cpu_count()} cores, {args.repeats} run(s) per tree, seconds per call\n"
    )
    print(table(results, args.targets))


if __name__ == "__main__":
    main()
