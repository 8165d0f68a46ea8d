"""``dpcda sample``: more rows from a release's model, later (``pipeline.sample``).

    dpcda sample --release releases/wa-churn-eps10 --rows 50000 --output samples/wa-churn-50k

Post-processing of the release: no budget, no ledger entry; the sample's manifest names the release and states its
epsilon and delta as inherited. A release keeps a model when its mechanism is marginals (``model/``).

Wiring (``dpcda.pipeline.cli``): ``build_parser`` calls ``register(sub)``; ``SampleError`` and ``ModelError`` in its
``_KNOWN``.
"""

from __future__ import annotations

import json


def register(subparsers) -> dict:
    from dpcda.pipeline.sample import MAX_SAMPLE_ROWS

    s = subparsers.add_parser(
        "sample",
        allow_abbrev=False,
        help="draw more rows from a table release's model (post-processing: no budget, no ledger entry)",
    )
    s.add_argument("--release", required=True, help="the folder of a published release that keeps a model (marginals)")
    s.add_argument("--rows", required=True, help=f"how many rows to draw, 1 to {MAX_SAMPLE_ROWS:,}")
    s.add_argument("--output", required=True, help="the folder to publish the sample in (synthetic/, manifest.json)")
    s.add_argument("--overwrite", action="store_true", help="replace a release or sample of ours at OUTPUT")
    s.add_argument(
        "--seed",
        default=None,
        help="draw reproducibly: the same seed gives the same rows (still private: the model is)",
    )
    return {"sample": cmd_sample}


def cmd_sample(args, _beam_args) -> int:
    from dpcda.pipeline.cli.base import published
    from dpcda.pipeline.sample import check_output, check_rows, check_seed, open_release, write_sample

    rows = check_rows(args.rows, "--rows")  # every flag checked before anything is written
    seed = check_seed(args.seed, "--seed")
    release = open_release(args.release)
    check_output(args.output, release.directory)
    manifest = write_sample(
        release,
        rows,
        args.output,
        overwrite=args.overwrite,
        seed=seed,
        on_published=lambda: published(f"the sample at {args.output}"),
    )
    print(
        json.dumps(
            {
                "output": args.output,
                "rows": manifest.output.rows,
                "source": manifest.source.path,
                "epsilon_inherited": manifest.privacy.epsilon,
                "delta_inherited": manifest.privacy.delta,
            }
        )
    )
    return 0
