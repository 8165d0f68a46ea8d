"""``dpcda audit`` (a canary game on a configuration) and ``dpcda audit-release`` (a release's membership audit)."""

from __future__ import annotations


def register(sub) -> dict:
    """Adds this module's subcommand parsers to ``sub``; returns their handlers by name."""
    from dpcda.schemas.config import AUDIT_MAX_TRIALS, ReleaseConfig, mechanism_names
    from dpcda.schemas.config_keys import DEFAULT_MECHANISM
    from dpcda.schemas.mechanism_params import DpmixParams, MechanismParams

    defaults = {
        name: field.get_default() for name, field in ReleaseConfig.model_fields.items() if not field.is_required()
    }  # the release's defaults
    defaults.update(
        mechanism=DEFAULT_MECHANISM,
        mixing_order=MechanismParams.model_fields["mixing_order"].default,
        label_noise_ratio=DpmixParams.model_fields["label_noise_ratio"].default,
    )
    au = sub.add_parser("audit", allow_abbrev=False, help="empirical lower bound on epsilon for a configuration")
    au.add_argument(
        "--mechanism",
        choices=mechanism_names(),
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
    au.add_argument(
        "--samples-per-class",
        type=int,
        default=1,
        help=f"rows each run releases (trials x this at most {AUDIT_MAX_TRIALS * 16:,})",
    )
    au.add_argument(
        "--trials", type=int, default=2000, help=f"mechanism runs on each dataset (4 to {AUDIT_MAX_TRIALS:,})"
    )
    au.add_argument("--seed", type=int, default=0)
    au.add_argument("--json", action="store_true")

    from dpcda.evaluation.membership import add_parser as add_audit_release_parser

    add_audit_release_parser(sub)
    return {"audit": cmd_audit, "audit-release": cmd_audit_release}


def cmd_audit(args, _beam_args) -> int:
    from dpcda.evaluation.audit import run_audit_cli

    return run_audit_cli(args)


def cmd_audit_release(args, beam_args) -> int:
    from dpcda.evaluation.membership import cmd_audit_release as run

    return run(args, beam_args)
