"""``dpcda schema infer``: a draft ``table:`` section from a Parquet schema."""

from __future__ import annotations

import hashlib
import json

SCHEMA_NOTE = """\
# A DRAFT from the Parquet schema of {path} (names, types and nullability from its footer, {files} file(s) matched;
# no row was read).
# Fill in what only you can declare from public knowledge, never from the data (data-derived bounds and category
# lists are not private): the label's categories (class k is categories[k]), each numeric column's lower/upper,
# each categorical column's categories. nullable is true wherever the input's field allows a null: set it to false
# only from public knowledge of the domain (a null is impossible whoever is in the table: a required field, a key),
# never because this table holds none (the release states it in its public schema, and no guarantee covers that).
# A release refuses to start while a bound or a category list is missing. With the marginals mechanism drafted
# below, a column you delete from the list (or a label without categories) is derived by the release's DP domain step
# instead, for a share of the budget (--domain-budget-share); mode poisson: add or remove a record, the label
# included, so no exact class size is published.
"""


DRAFT_MARK = "# dpcda schema infer draft; sha256 of the lines below: "

# the table mechanism under add/remove: no exact class size is published (docs/tables.md)
DRAFT_MECHANISM = {"mechanism": "marginals", "mode": "poisson"}


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


def register(sub) -> dict:
    """Adds this module's subcommand parsers to ``sub``; returns their handlers by name."""
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
        help="glob of Parquet shards (the first file's schema; no row is read)",
    )
    infer.add_argument("--label", required=True, help="the label column")
    infer.add_argument("--out", default=None, help="write the draft to this file (default: print it)")
    infer.add_argument("--overwrite", action="store_true", help="replace an earlier --out draft of this command")
    return {"schema": cmd_schema}


def cmd_schema(args, _beam_args) -> int:
    import yaml

    from dpcda.schemas.table import SchemaError, infer_draft
    from dpcda.storage.outputs import check_file_output, write_file_output
    from dpcda.storage.paths import expand_glob, not_regular_files
    from dpcda.storage.shards import InputError
    from dpcda.storage.tables import arrow_schema_of

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
    draft = {**DRAFT_MECHANISM, "table": infer_draft(schema, args.label)}
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
