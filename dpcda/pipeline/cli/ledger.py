"""``dpcda ledger``: the releases of each dataset id and their composed budget."""

from __future__ import annotations

import json
import math


def register(sub) -> dict:
    """Adds this module's subcommand parsers to ``sub``; returns their handlers by name."""
    led = sub.add_parser("ledger", allow_abbrev=False, help="the releases of each dataset id and their composed budget")
    led_sub = led.add_subparsers(dest="ledger_command", required=True)
    init = led_sub.add_parser("init", allow_abbrev=False, help="create a ledger (releases refuse one that is missing)")
    init.add_argument("--ledger", required=True, help="a local SQLite file or gs://bucket/object")
    cap = led_sub.add_parser(
        "cap",
        allow_abbrev=False,
        help="store or change a dataset's budget cap (every release answers to it; one that gives another "
        "--budget-cap is refused)",
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
    res.add_argument("--force", action="store_true", help="the run is known to have stopped (reserved under 48 h ago)")
    res.add_argument(
        "--drop",
        action="store_true",
        help="drop the reservation: locally although OUTPUT holds a later release of another run (known not "
        "published); on gs:// instead of marking it exposed (only if nobody could list the bucket while it ran)",
    )
    return {"ledger": cmd_ledger}


def _fmt_eps(eps) -> str:
    return "inf" if eps is None or not math.isfinite(eps) else f"{eps:.4g}"


def cmd_ledger(args, _beam_args) -> int:
    from dpcda.storage.ledger import open_ledger
    from dpcda.storage.ledger_resolve import resolve, summary

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
