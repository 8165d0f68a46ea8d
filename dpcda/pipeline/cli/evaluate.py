"""``dpcda evaluate``: train the evaluation model on a release, test it on real data."""

from __future__ import annotations

import json
import os


def register(sub) -> dict:
    """Adds this module's subcommand parsers to ``sub``; returns their handlers by name."""
    from dpcda.schemas.config import EVAL_EPOCHS_MAX, EVAL_RUNS_MAX

    ev = sub.add_parser("evaluate", allow_abbrev=False, help="train the evaluation CNN on a release, test on real data")
    ev.add_argument("--synthetic", required=True, help="release directory (holds synthetic/ and manifest.json)")
    ev.add_argument("--test", required=True, help="glob of real test shards")
    ev.add_argument("--runs", type=int, default=3, help=f"training seeds (1 to {EVAL_RUNS_MAX})")
    ev.add_argument("--epochs", type=int, default=10, help=f"epochs per run (1 to {EVAL_EPOCHS_MAX})")
    ev.add_argument("--out", default=None, help="report folder (default SYNTHETIC/evaluation)")
    ev.add_argument("--seed", type=int, default=0, help="first training seed (runs use seed .. seed+R-1)")
    return {"evaluate": cmd_evaluate}


def _evaluation_out(args) -> str:
    """Where ``dpcda evaluate`` writes: never over the release's own evaluation (its manifest's utility section names
    it: replacing it would change a published release), never into a folder of test files, a file or a link."""
    from dpcda.evaluation.stage import EVAL_DIR
    from dpcda.storage.outputs import check_dir_output
    from dpcda.storage.paths import exists, expand_glob, is_remote, join, open_file
    from dpcda.storage.publish import MANIFEST, PublishError

    own = join(args.synthetic, EVAL_DIR)
    out = args.out or own
    manifest_path = join(args.synthetic, MANIFEST)
    same = out.rstrip("/") == own.rstrip("/") or (not is_remote(out) and os.path.realpath(out) == os.path.realpath(own))
    if same and exists(manifest_path):
        try:
            with open_file(manifest_path) as fh:
                utility = (json.loads(fh.read()) or {}).get("utility")
        except (OSError, ValueError):
            utility = None  # the evaluation itself says what is wrong with the manifest
        if utility and (not isinstance(utility, dict) or set(utility) != {"quality"}):  # quality.json: a file apart
            raise PublishError(
                f"{out}: holds the release's own evaluation (its manifest's utility section names it); pass --out DIR "
                f"to write this one elsewhere"
            )
    return check_dir_output(out, flag="--out", inputs=expand_glob(args.test))


def cmd_evaluate(args, _beam_args) -> int:
    from dpcda.evaluation.report import named_headline as named
    from dpcda.evaluation.standalone import evaluate_standalone
    from dpcda.schemas.config import EVAL_EPOCHS_MAX, EVAL_RUNS_MAX
    from dpcda.storage.publish import PublishError

    for flag, value, most in (("--runs", args.runs, EVAL_RUNS_MAX), ("--epochs", args.epochs, EVAL_EPOCHS_MAX)):
        if not 1 <= value <= most:
            raise PublishError(f"{flag} must be in [1, {most}], got {value}")
    out = _evaluation_out(args)
    try:
        report = evaluate_standalone(
            args.synthetic, args.test, runs=args.runs, epochs=args.epochs, out=out, seed=args.seed
        )
    except OSError as err:  # the report folder cannot be written (a read-only folder, a full disk)
        where = err.filename if isinstance(err.filename, str) else ""
        if not where or not os.path.abspath(where).startswith(os.path.abspath(out)):
            raise
        raise PublishError(f"--out {out}: cannot write {where} ({err.strerror or type(err).__name__})") from None
    print(
        json.dumps(
            {
                "accuracy_mean": report["accuracy_mean"],
                "accuracy_std": report["accuracy_std"],
                **named(report),
                "report": report.get("path"),
            }
        )
    )
    return 0
