"""``dpcda account``: calibrate or account one group's synthesis without data."""

from __future__ import annotations

import json
import math

# the release settings account takes, as the release's flags (values reach the config as text: it checks them)
ACCOUNT_FIELDS = (
    "epsilon", "sigma_x", "delta", "mode", "clip", "normalization", "normalization_budget_share",
    "histogram_budget_share", "pca_budget_share", "domain_budget_share",
)  # fmt: skip


def register(sub) -> dict:
    """Adds this module's subcommand parsers to ``sub``; returns their handlers by name."""
    from dpcda.pipeline.cli.release import help_of, release_flags
    from dpcda.schemas.config import mechanism_keys, mechanism_names
    from dpcda.schemas.config_keys import DEFAULT_MECHANISM

    acc = sub.add_parser(
        "account",
        allow_abbrev=False,
        help="calibrate or account one group's synthesis without data, after the shares a release spends first",
    )
    acc.add_argument("--mechanism", choices=mechanism_names(), default=DEFAULT_MECHANISM)
    acc.add_argument(
        "--class-size",
        type=int,
        required=True,
        help="N_k for dpcda; the dataset size N for dpmix, p3gm and marginals; any size for local/randproj",
    )
    acc.add_argument(
        "--samples-per-class",
        type=int,
        default=None,
        help="T_k for dpcda; T, the rows in total, for dpmix (ignored by local/randproj/p3gm)",
    )
    acc.add_argument("--feature-dim", type=int, default=None, help="d (with --projection, for randproj and p3gm)")
    acc.add_argument("--num-classes", type=int, default=None, help="p3gm: K; marginals: the label's categories")
    acc.add_argument(
        "--table-columns", type=int, default=None, help="marginals: the table's columns, the label included"
    )
    acc.add_argument(
        "--derived-numeric", type=int, default=None, help="marginals: numeric columns the DP domain step derives"
    )
    acc.add_argument(
        "--derived-categorical",
        type=int,
        default=None,
        help="marginals: string columns (and the label) whose categories the DP domain step derives",
    )
    mechanism = set(mechanism_keys()) - {"samples"}  # T is --samples-per-class here
    for flag, (name, field) in release_flags().items():
        if name in ACCOUNT_FIELDS or name in mechanism:
            text, metavar = help_of(field)
            acc.add_argument(flag, dest=name, default=None, metavar=metavar, help=text)
    acc.add_argument("--json", action="store_true")
    return {"account": cmd_account}


def cmd_account(args, _beam_args) -> int:
    from dpcda.pipeline.accounting import account

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
