"""``dpcda audit``: a canary game on a configuration, printed as a table or JSON."""

from __future__ import annotations

import json

from dpcda.evaluation.audit.play import json_safe, run_audit
from dpcda.evaluation.audit.statistics import CONFIDENCE
from dpcda.mechanisms import registry


def format_table(result: dict) -> str:
    keys = [
        "mode",
        "mixing_order",
        "class_size",
        "samples_per_class",
        "expected_batch",
        "steps",
        "sigma_x",
        "noise_multiplier",
        "sampling_rate",
        "accounted_epsilon",
        "claimed_epsilon",
        "empirical_epsilon_lower_bound",
        "max_detectable_epsilon",
        "violation",
        "fp",
        "fn",
        "fp_upper",
        "fn_upper",
        "trials",
        "noiseless_privacy_epsilon",
        "device",
        "wall_seconds",
    ]
    lines = []
    for k in (k for k in keys if k in result):
        v = result[k]
        lines.append(f"{k:>30}: {v:.4g}" if isinstance(v, float) else f"{k:>30}: {v}")
    lines.append(
        f"{'':>30}  lower bound at {CONFIDENCE:.0%} confidence on synthetic canary data; "
        f"noiseless_privacy_epsilon is informational, NOT a guarantee"
    )
    return "\n".join(lines)


def audit_mode(mechanism: str, mode) -> str:
    """The mode a mechanism is audited in: the one asked for (refused by ``run_audit`` if the mechanism does not
    offer it), else the mechanism's default (``MechanismParams.default_mode``)."""
    return mode if mode is not None else registry.get(mechanism).params.default_mode()


def run_audit_cli(args) -> int:
    """``dpcda audit``: prints the result; exit status 1 when the bound exceeds the accounted epsilon."""
    result = run_audit(
        mode=audit_mode(args.mechanism, args.mode),
        mixing_order=args.mixing_order,
        epsilon=args.epsilon,
        delta=args.delta,
        class_size=args.class_size,
        samples_per_class=args.samples_per_class,
        trials=args.trials,
        seed=args.seed,
        mechanism=args.mechanism,
        label_noise_ratio=args.label_noise_ratio,
        normalization=args.normalization,
    )
    print(json.dumps(json_safe(result), indent=2) if args.json else format_table(result))
    return 1 if result["violation"] else 0
