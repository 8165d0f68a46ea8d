"""``dpcda risk``: what an (epsilon, delta) claim means to an attacker."""

from __future__ import annotations

import json

RISK_PLOT_TAG = {"Software": "dpcda risk"}  # a PNG text chunk: what says a plot is ours to replace


def _our_risk_plot(path: str) -> bool:
    from PIL import Image

    try:
        with Image.open(path) as img:
            return img.format == "PNG" and img.info.get("Software") == RISK_PLOT_TAG["Software"]
    except Exception:  # noqa: BLE001 - unreadable as a PNG: not ours
        return False


def register(sub) -> dict:
    """Adds this module's subcommand parsers to ``sub``; returns their handlers by name."""
    risk = sub.add_parser("risk", allow_abbrev=False, help="what an (epsilon, delta) claim means to an attacker")
    risk.add_argument("--epsilon", type=float, required=True)
    risk.add_argument("--delta", type=float, default=1e-5)
    risk.add_argument("--json", action="store_true")
    risk.add_argument("--plot", default=None, help="write the trade-off curve to this PNG")
    risk.add_argument("--overwrite", action="store_true", help="replace an earlier --plot of this command")
    return {"risk": cmd_risk}


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
