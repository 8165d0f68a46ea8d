"""``dpcda account``: calibrate or account one group's synthesis without data."""

from __future__ import annotations

import json
import math

P3GM_KNOBS = ("p3gm_latent_dim", "p3gm_components", "p3gm_em_iterations", "p3gm_epochs", "p3gm_batch",
              "p3gm_hidden", "p3gm_encoder_hidden")  # fmt: skip


def register(sub) -> dict:
    """Adds this module's subcommand parsers to ``sub``; returns their handlers by name."""
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
    acc.add_argument(
        "--table-columns", type=int, default=None, help="marginals: the table's columns, the label included"
    )
    acc.add_argument(
        "--derived-numeric", type=int, default=0, help="marginals: numeric columns whose domain the DP step derives"
    )
    acc.add_argument(
        "--derived-categorical",
        type=int,
        default=0,
        help="marginals: string columns (and the label) whose categories the DP domain step derives",
    )
    acc.add_argument("--domain-budget-share", type=float, default=defaults["domain_budget_share"])
    acc.add_argument("--epsilon", type=float)
    acc.add_argument("--sigma-x", type=float)
    acc.add_argument("--delta", type=float, default=defaults["delta"])
    acc.add_argument("--json", action="store_true")
    return {"account": cmd_account}


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
