"""Release-level membership audit on full Fashion-MNIST: a default release and a deliberately leaky one.

    .venv/bin/python -m benchmarks.reproduce.membership_table          # two releases + audits, ~5-10 min on 2 CPU cores

(a) the default release: DP-CDA ``fixed``, eps 10, l = 16, ``--lowpass 16``; (b) a leaky release: ``--sigma-x 0
--mixing-order 1`` (every synthetic row is a normalised training record: no privacy, no claim). Each goes through
the release job in-process (``pipeline.release.run_release`` on the DirectRunner, as ``dpcda release`` runs it) with
the canary audit's stage and then the membership audit's stage, both writing the manifest's ``audit`` section.
Members: 10 000 rows of ``data/fashion-mnist/train`` (the release's input); non-members: 10 000 rows of
``data/fashion-mnist/test`` (prepared with ``dpcda prepare fashion-mnist`` if missing). The releases use the test
noise seed ``--release-seed`` (reproducible, NOT private; the manifest says so) and the audit the public sample seed
``--seed``. Prints a markdown table and writes benchmarks/results/membership_audit.md.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from dpcda.evaluation.audit import audit_section  # noqa: E402
from dpcda.evaluation.membership import DEFAULT_ROWS, membership_audit_section  # noqa: E402
from dpcda.pipeline.release import Stage, run_release  # noqa: E402
from dpcda.schemas.config import load_config  # noqa: E402

BEAM_ARGS = ["--runner=DirectRunner", "--direct_running_mode=in_memory"]
RELEASES = {
    "default (eps 10, l 16, lowpass 16, fixed)": {"epsilon": 10.0, "mixing_order": 16, "lowpass": 16, "mode": "fixed"},
    "leaky (sigma_x 0, l 1)": {"sigma_x": 0.0, "mixing_order": 1, "mode": "fixed"},
}
OUT = ROOT / "benchmarks" / "results" / "membership_audit.md"


def _fmt(x, digits: int = 4) -> str:
    if x is None:
        return "none (inf)"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        return "inf" if math.isinf(x) else f"{x:.{digits}g}"
    return str(x)


def prepare(data: Path) -> None:
    if (data / "train").is_dir() and (data / "test").is_dir():
        return
    cmd = [sys.executable, "-m", "dpcda.pipeline.cli", "prepare", "fashion-mnist", "--out", str(data), "--shards", "4"]
    print("preparing:", " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, cwd=ROOT, check=True)


def run_one(name: str, overrides: dict, args, workdir: Path) -> dict:
    train, test = str(args.data / "train" / "*.parquet"), str(args.data / "test" / "*.parquet")
    out = workdir / name.split(" ")[0]
    cfg = load_config(None, {"input": train, "output": str(out), "seed": args.release_seed, **overrides})
    stages = (  # as --audit and --membership-audit add them (release_stages), with this run's rows and seed
        Stage("audit", "audit", lambda w, m: audit_section(m.model_dump(mode="json"))),
        Stage(
            "membership audit",
            "audit",
            lambda w, m: membership_audit_section(
                w, m.model_dump(mode="json"), cfg.input, test, rows=args.rows, seed=args.seed
            ),
        ),
    )
    t0 = time.time()
    manifest = run_release(cfg, list(BEAM_ARGS), stages, eval_input=test).model_dump(mode="json")
    seconds = time.time() - t0
    published = json.loads((out / "manifest.json").read_text())
    assert published["audit"]["membership"] == manifest["audit"]["membership"]
    return {"name": name, "manifest": published, "seconds": seconds}


def table(results: list[dict]) -> list[str]:
    lines = [
        "| release | claimed eps | AUC | median dist. members / non-members | threshold | FP (upper) | FN (upper) "
        "| eps lower bound (95 %) | max detectable | violation | canary audit bound | audit s | release+audits s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for r in results:
        m = r["manifest"]["audit"]["membership"]
        canary = r["manifest"]["audit"].get("empirical_epsilon_lower_bound")
        threshold = (
            "none (trivial test)"
            if m["threshold"] is None
            else f"{m['threshold']:.3g} ({m['guess_member_when'].split()[1]})"
        )
        lines.append(
            f"| {r['name']} | {_fmt(m['claimed_epsilon'])} | {_fmt(m['roc_auc'])} | "
            f"{_fmt(m['median_distance_members'], 3)} / {_fmt(m['median_distance_non_members'], 3)} | "
            f"{threshold} | "
            f"{_fmt(m['fp'], 3)} ({_fmt(m['fp_upper'], 3)}) | {_fmt(m['fn'], 3)} ({_fmt(m['fn_upper'], 3)}) | "
            f"{_fmt(m['empirical_epsilon_lower_bound'], 3)} | {_fmt(m['max_detectable_epsilon'], 3)} | "
            f"{_fmt(m['violation'])} | {_fmt(canary, 3)} | {m['wall_seconds']:.1f} | {r['seconds']:.0f} |"
        )
    return lines


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=ROOT / "data" / "fashion-mnist")
    ap.add_argument("--rows", type=int, default=DEFAULT_ROWS, help="audited rows per side")
    ap.add_argument("--seed", type=int, default=0, help="public seed of which rows are audited")
    ap.add_argument("--release-seed", type=int, default=0, help="TEST noise seed of the releases (reproducible)")
    ap.add_argument("--workdir", type=Path, default=None, help="where the releases go (default: a temporary folder)")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    prepare(args.data)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="dpcda-membership-"))
    try:
        results = [run_one(name, overrides, args, workdir) for name, overrides in RELEASES.items()]
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    m0 = results[0]["manifest"]["audit"]["membership"]
    data = args.data.resolve()
    shown = data.relative_to(ROOT) if data.is_relative_to(ROOT) else data
    lines = [
        f"Generated by `{' '.join(['.venv/bin/python -m benchmarks.reproduce.membership_table', *argv])}`",
        "",
        f"Fashion-MNIST (`{shown}`): members are {m0['members']} rows of the release's input (the train split), "
        f"non-members {m0['non_members']} rows of the held-out test split; sample seed {args.seed} (public), "
        f"release noise seed {args.release_seed} (test seed: reproducible, not private). Each release ran in-process "
        f"on the DirectRunner with the canary audit stage and the membership audit stage "
        f"(`evaluation.membership.membership_audit_section`). Score: distance to the nearest of the "
        f"{m0['synthetic_rows']} synthetic rows in the release's normalised space; threshold chosen on one half of "
        f"the rows, FP/FN and the bound on the other ({m0['evaluation_rows'][0]} + {m0['evaluation_rows'][1]} rows); "
        f"one-sided Clopper-Pearson at 97.5 % each (95 % together). Device: {m0['device']}; machine: 2 CPU cores "
        f"with a background load.",
        "",
        *table(results),
        "",
        "These figures are statistics of private rows computed without noise: OUTSIDE the privacy guarantee "
        "(the manifest's `audit.membership.outside_guarantee`). A bound can never exceed the max detectable "
        "epsilon of this many rows, so at this size no claim above it can be shown violated; the leaky release has "
        "no claim (infinite epsilon), so its `violation` is no by definition while its bound shows the leak. The "
        "canary audit bound is the mechanism-level game (`evaluation.audit`, a small canary class; it is not audited "
        "against the leaky release's missing claim either).",
    ]
    text = "\n".join(lines) + "\n"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
