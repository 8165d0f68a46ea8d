"""``dpcda feasibility`` and ``dpcda sample-boolean``: seed 002's private sampling, a tool beside the release.

``feasibility`` evaluates Theorem 4.1 (``privacy.feasibility``) without data: how many records n the theorem needs
for p columns, epsilon and k synthetic rows, and, given n, whether it holds. ``sample-boolean`` runs Algorithm 1
(``mechanisms.private_sampling``) on a Parquet or CSV table of 0/1 columns and writes the k sampled rows, with the
same column names, plus a JSON sidecar ``OUTPUT.json`` (dp true/false, the conditions, the generator, caveats).

The sampler refuses to write anything unless Theorem 4.1 holds for (n, p, epsilon, k, d, m, delta, Delta). With
``--allow-not-dp`` it writes, and the sidecar says ``"dp": false`` with the one-line reason; such an output is NOT
differentially private. Numeric flags are read as text and checked here, so a bad value ends in one line.

Wiring (``dpcda.pipeline.cli``): ``build_parser`` calls ``register(sub)`` on its subparsers; ``FeasibilityError`` and
``PrivateSamplingError`` in its ``_KNOWN``.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys

NOT_A_DP_DELTA = "the paper's delta: the density's floor is delta/m and the accuracy 4 delta (NOT a DP delta: the "
TABLE_SUFFIXES = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv"}
SIDECAR_TOOL = "dpcda sample-boolean (seed 002 private sampling, Algorithm 1)"


def register(subparsers) -> dict:
    """Add ``feasibility`` and ``sample-boolean`` to an argparse subparsers object; return name -> command."""
    from dpcda.privacy import feasibility as fz

    def theorem_flags(p):
        p.add_argument("--epsilon", required=True, help="epsilon of the pure eps-DP claim")
        p.add_argument("--degree", default=str(fz.DEFAULT_DEGREE), help="d, the degree of matched marginals")
        p.add_argument(
            "--reduced-space",
            default=None,
            help=f"m, the size of the reduced space (default {fz.REDUCED_SPACE_FACTOR} x the number of Walsh "
            "functions of degree <= d)",
        )
        p.add_argument(
            "--delta",
            default=str(fz.DEFAULT_DELTA),
            help=NOT_A_DP_DELTA + "guarantee is pure eps-DP)",
        )
        p.add_argument("--big-delta", default=str(fz.DEFAULT_BIG_DELTA), help="the paper's Delta: the ceiling Delta/m")

    f = subparsers.add_parser(
        "feasibility",
        allow_abbrev=False,
        help="seed 002 Theorem 4.1: how many records private sampling needs for a DP Boolean table",
    )
    f.add_argument("--dimension", required=True, help="p, the number of 0/1 columns")
    f.add_argument("--synthetic-size", default="1", help="k, the synthetic rows (default 1)")
    f.add_argument("--records", default=None, help="n, the number of records: adds the verdict")
    theorem_flags(f)
    f.add_argument("--gamma", default=str(fz.DEFAULT_GAMMA), help="Theorem 4.2's failure parameter (accuracy only)")
    f.add_argument("--json", action="store_true", help="print the conditions as JSON")

    s = subparsers.add_parser(
        "sample-boolean",
        allow_abbrev=False,
        help="seed 002 private sampling of a 0/1 table (p <= 20); refuses unless Theorem 4.1 makes it DP",
    )
    s.add_argument("--input", required=True, help="a Parquet (.parquet, .pq) or CSV (.csv) file of 0/1 columns")
    s.add_argument("--output", required=True, help="the sampled table (.parquet, .pq or .csv); sidecar OUTPUT.json")
    s.add_argument("--synthetic-size", required=True, help="k, the rows to sample")
    theorem_flags(s)
    s.add_argument(
        "--allow-not-dp",
        action="store_true",
        help="write even when Theorem 4.1 does not hold; the sidecar then says dp: false (NOT private)",
    )
    s.add_argument("--overwrite", action="store_true", help="replace an existing OUTPUT and OUTPUT.json")
    s.add_argument("--seed", default=None, help="TEST ONLY: noise key from this seed (reproducible, NOT private)")
    return {"feasibility": cmd_feasibility, "sample-boolean": cmd_sample_boolean}


# ---------------------------------------------------------------- flag values


def _number(args, name: str, kind=float, optional: bool = False):
    """The value of flag --NAME as ``kind``; FeasibilityError (one line, naming the flag) when it does not parse."""
    from dpcda.privacy.feasibility import FeasibilityError

    text = getattr(args, name.replace("-", "_"))
    if text is None and optional:
        return None
    try:
        value = kind(text)
    except (TypeError, ValueError):
        what = "an integer" if kind is int else "a number"
        raise FeasibilityError(f"--{name} must be {what}, got {text!r}") from None
    return value


def _theorem_args(args) -> dict:
    return {
        "epsilon": _number(args, "epsilon"),
        "degree": _number(args, "degree", int),
        "reduced_space": _number(args, "reduced-space", int, optional=True),
        "delta": _number(args, "delta"),
        "big_delta": _number(args, "big-delta"),
    }


# ---------------------------------------------------------------- feasibility


def _g(x) -> str:
    if x is None:
        return "-"
    return f"{x:.3g}" if abs(x) >= 1e6 or (0 < abs(x) < 1e-3) else f"{x:g}"


def plain_words(c: dict) -> str:
    """The verdict without the paper's notation: what the private table needs, and whether it has it."""
    what = (
        f"In plain words: to sample {c['synthetic_size']} synthetic row(s) of a table of {c['dimension']} yes/no "
        f"column(s) with epsilon {c['epsilon']:g} (pure DP), the private table needs at least "
        f"{_g(c['min_records'])} records"
    )
    if c["records"] is None:
        return what + "; pass --records N to check a table of N records."
    verdict = (
        "enough: the theorem certifies the sample as private"
        if c["dp"]
        else "too few: the theorem does NOT certify the sample as private"
    )
    return what + f"; {c['records']} record(s) is {verdict}."


def feasibility_text(c: dict) -> str:
    acc = c["accuracy_theorem"]
    m_note = "given" if c["reduced_space_given"] else f"default {c['reduced_space'] // c['walsh_count']} x Walsh count"
    lines = [
        plain_words(c),
        f"Theorem 4.1 (seed 002): {c['guarantee']}; neighbours: {c['neighbouring_relation']}",
        f"  p={c['dimension']}, d={c['degree']} ({c['walsh_count']} Walsh functions), eps={c['epsilon']:g}, "
        f"k={c['synthetic_size']}, delta={c['delta']:g}, Delta={c['big_delta']:g}, m={c['reduced_space']} ({m_note})",
        f"  records needed: n >= {_g(c['min_records'])} at m={c['reduced_space']}; n >= "
        f"{_g(c['min_records_any_reduced_space'])} at the smallest m={c['walsh_count']} (no m needs fewer)",
    ]
    if c["records"] is not None:
        lines.append(f"  at n={c['records']}: k <= {_g(c['synthetic_size_bound'])}; {c['reason']}")
    if not c["algorithm_well_defined"]:
        lines.append(
            "  Algorithm 1 cannot run with these values: it needs 2 delta <= 1 <= Delta - delta and m >= the "
            "Walsh count"
        )
    rng = "empty" if not acc["reduced_space_range_consistent"] else "non-empty"
    lines.append(
        f"  accuracy (Theorem 4.2, not needed for privacy): {_g(acc['min_reduced_space'])} <= m <= "
        f"{_g(acc['max_reduced_space'])} ({rng}), n >= {_g(acc['min_records'])}, k >= "
        f"{_g(acc['min_synthetic_size'])}, success probability {acc['success_probability']:.3g}"
    )
    return "\n".join(lines)


def cmd_feasibility(args, _beam_args) -> int:
    from dpcda.privacy.feasibility import conditions

    c = conditions(
        _number(args, "dimension", int),
        synthetic_size=_number(args, "synthetic-size", int),
        records=_number(args, "records", int, optional=True),
        gamma=_number(args, "gamma"),
        **_theorem_args(args),
    )
    print(json.dumps(c) if args.json else feasibility_text(c))
    return 0


# ---------------------------------------------------------------- sample-boolean


def _kind(path: str, flag: str) -> str:
    from dpcda.mechanisms.private_sampling import PrivateSamplingError

    if "://" in path:
        raise PrivateSamplingError(f"{flag} {path}: local files only")
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in TABLE_SUFFIXES:
        raise PrivateSamplingError(f"{flag} {path}: expected a .parquet, .pq or .csv file")
    return TABLE_SUFFIXES[suffix]


def _safe_reason(err: Exception) -> str:
    """Why a file did not parse, without its contents: Arrow's CSV errors quote the offending private row."""
    import re

    text = (str(err).splitlines() or [""])[0]
    if isinstance(err, OSError) and not str(err).startswith("CSV"):
        return err.strerror or type(err).__name__
    shape = re.search(r"Expected \d+ columns, got \d+", text)
    if shape:
        return f"malformed row ({shape.group(0)}; the row is not shown)"
    return f"{type(err).__name__} (details not shown: they may quote private values)"


def read_boolean_table(path: str):
    """(names, Arrow types, (n, p) uint8 bits) of a Parquet/CSV file of 0/1 columns; one-line errors name the spot."""
    import numpy as np
    import pyarrow as pa

    from dpcda.mechanisms.private_sampling import MAX_COLUMNS, PrivateSamplingError

    kind = _kind(path, "--input")
    try:
        if kind == "parquet":
            import pyarrow.parquet as pq

            table = pq.read_table(path)
        else:
            import pyarrow.csv as pcsv

            table = pcsv.read_csv(path)
    except FileNotFoundError:
        raise PrivateSamplingError(f"{path}: no such file") from None
    except (pa.ArrowException, OSError) as err:
        raise PrivateSamplingError(f"{path}: cannot read as {kind}: {_safe_reason(err)}") from None
    names = table.column_names
    if not 1 <= len(names) <= MAX_COLUMNS:
        raise PrivateSamplingError(f"{path}: {len(names)} columns; sample-boolean takes 1 to {MAX_COLUMNS}")
    if table.num_rows == 0:
        raise PrivateSamplingError(f"{path}: no rows")
    bits = np.empty((table.num_rows, len(names)), np.uint8)
    for j, name in enumerate(names):
        col = table.column(name)
        t = col.type
        if not (pa.types.is_boolean(t) or pa.types.is_integer(t) or pa.types.is_floating(t)):
            raise PrivateSamplingError(f"{path}: column {name!r} has type {t}; expected 0/1 numbers or booleans")
        if col.null_count:
            row = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
            raise PrivateSamplingError(f"{path}: column {name!r}, row {row}: missing value; expected 0 or 1")
        values = col.to_numpy(zero_copy_only=False)
        bad = ~((values == 0) | (values == 1))
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise PrivateSamplingError(f"{path}: column {name!r}, row {row}: a value that is not 0 or 1")
        bits[:, j] = values.astype(np.uint8)
    return names, [table.schema.field(n).type for n in names], bits


def _write_table(fh, kind: str, names, types, rows) -> None:
    """The sampled rows as Parquet or CSV, written to the binary file object ``fh``."""
    import pyarrow as pa

    cols = []
    for j, t in enumerate(types):
        arr = pa.array(rows[:, j].astype("int64"))
        cols.append(arr.cast(t) if (pa.types.is_boolean(t) or pa.types.is_integer(t)) else arr.cast(pa.int8()))
    table = pa.Table.from_arrays(cols, names=list(names))
    if kind == "parquet":
        import pyarrow.parquet as pq

        pq.write_table(table, fh)
    else:
        import pyarrow.csv as pcsv

        pcsv.write_csv(table, fh)


def sidecar(result, *, names, reproducible_seed: bool) -> dict:
    """What OUTPUT.json says: public parameters and the verdict only (nothing computed from the data but n)."""
    from importlib.metadata import version

    from dpcda.mechanisms import private_sampling as ps
    from dpcda.privacy import noise

    c = result.conditions
    caveats = list(ps.CAVEATS)
    if not result.dp:
        caveats.insert(0, f"NOT differentially private ({result.reason}); written because of --allow-not-dp")
    if reproducible_seed:
        caveats.insert(
            0, "reproducible_seed: the noise key comes from a --seed (tests only): the output is NOT private"
        )
    return {
        "tool": SIDECAR_TOOL,
        "dp": result.dp and not reproducible_seed,  # a --seed rebuilds every draw: not private, whatever the theorem
        "epsilon": c["epsilon"] if result.dp else None,
        "dp_delta": 0.0 if result.dp else None,
        "reason": result.reason,
        "neighbouring_relation": c["neighbouring_relation"],
        "rows": int(result.rows.shape[0]),
        "columns": list(names),
        "conditions": c,
        "reduced_space_draws": result.attempts,
        "noise": {"generator": noise.GENERATOR, "sampler": ps.SAMPLER},
        "solvers": {
            "lp": f"{ps.LP_SOLVER}, scipy {version('scipy')}",
            "qp": f"{ps.QP_SOLVER}, daqp {version('daqp')}",
        },
        "reproducible_seed": reproducible_seed,
        "caveats": caveats,
    }


def _sha256(path: str) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def check_output(out: str, *, inputs: list[str], overwrite: bool) -> tuple[str, frozenset]:
    """The sidecar path of OUTPUT and which of OUTPUT and the sidecar stand there now (earlier outputs of ours that
    ``overwrite`` allows replacing), once OUTPUT may be written; PrivateSamplingError (one line) when it may not.

    Never the input (by path, link or hard link); never a folder or a link; an existing OUTPUT or OUTPUT.json is
    replaced only with ``overwrite`` and only when it is an earlier output of this command: its sidecar names this
    tool and the SHA-256 of the table beside it. Checked before the input is read, so nothing is spent on a refusal.
    """
    from dpcda.mechanisms.private_sampling import PrivateSamplingError

    _kind(out, "--output")
    side = out + ".json"
    for path in (out, side):
        if any(_same_file(path, src) for src in inputs):
            raise PrivateSamplingError(f"--output {out}: {path} is the input; write the sample somewhere else")
        if os.path.islink(path):
            raise PrivateSamplingError(f"--output {out}: {path} is a symbolic link; give the real path")
        if os.path.lexists(path) and not os.path.isfile(path):
            raise PrivateSamplingError(f"--output {out}: {path} exists and is not a regular file")
    existing = [p for p in (out, side) if os.path.lexists(p)]
    if not existing:
        return side, frozenset()
    if not overwrite:
        raise PrivateSamplingError(f"{existing[0]} exists; pass --overwrite to replace it")
    not_ours = f"--output {out}: not an earlier sample-boolean output"
    try:
        with open(side) as fh:
            meta = json.load(fh)
    except FileNotFoundError:
        raise PrivateSamplingError(f"{not_ours} (no sidecar {side}); refusing to replace it") from None
    except (OSError, ValueError):
        raise PrivateSamplingError(f"{not_ours} ({side} is not its sidecar); refusing to replace it") from None
    if not isinstance(meta, dict) or meta.get("tool") != SIDECAR_TOOL:
        raise PrivateSamplingError(f"{not_ours} ({side} is not its sidecar); refusing to replace it")
    digest = meta.get("table_sha256")
    if not isinstance(digest, str):
        raise PrivateSamplingError(
            f"{not_ours} ({side} records no table_sha256: written by an older version); remove it yourself"
        )
    if os.path.exists(out) and _sha256(out) != digest:
        raise PrivateSamplingError(f"{not_ours} ({out} changed since {side} was written); refusing to replace it")
    return side, frozenset(existing)


def _write_temp(folder: str, beside: str, data: bytes) -> tuple[str, int]:
    """``data`` in a new file of an unpredictable name, created by us (O_EXCL) and written through its descriptor, so a
    link planted anywhere cannot redirect the write; (path, inode), to check it is still ours before the rename."""
    import tempfile

    fd, path = tempfile.mkstemp(prefix=f".{os.path.basename(beside)}.", suffix=".tmp", dir=folder)
    try:
        mask = os.umask(0o022)
        os.umask(mask)
        os.fchmod(fd, 0o666 & ~mask)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        return path, os.stat(path, follow_symlinks=False).st_ino
    except BaseException:
        os.remove(path)
        raise


def _check_ours(tmp: str, inode: int) -> None:
    """OSError unless the name still holds the file we wrote (not a link, not another file)."""
    import stat

    st = os.stat(tmp, follow_symlinks=False)
    if not stat.S_ISREG(st.st_mode) or st.st_ino != inode:
        raise OSError(0, f"the temporary file {tmp} was replaced by someone else")


def _replace_ours(tmp: str, inode: int, dest: str, replace: bool) -> None:
    """Renames our temp file onto ``dest``, checked to be ours just before. ``replace``: ``dest`` held an earlier
    output that ``check_output`` has just allowed to be replaced; otherwise nothing is replaced: a file that appeared
    at ``dest`` since the check is kept and the write refused (``renameat2(RENAME_NOREPLACE)``)."""
    from dpcda.storage.outputs import _rename_noreplace

    _check_ours(tmp, inode)
    if replace:
        os.replace(tmp, dest)
    else:
        _rename_noreplace(tmp, dest, "--output")


def cmd_sample_boolean(args, _beam_args) -> int:
    from dpcda.mechanisms.private_sampling import MAX_SYNTHETIC_SIZE, PrivateSamplingError, sample_boolean
    from dpcda.privacy.noise import fresh_key, key_from_test_seed
    from dpcda.storage.publish import PublishError

    out = args.output
    kind = _kind(out, "--output")
    params = _theorem_args(args)
    k = _number(args, "synthetic-size", int)
    if not 1 <= k <= MAX_SYNTHETIC_SIZE:
        raise PrivateSamplingError(f"--synthetic-size must be in [1, {MAX_SYNTHETIC_SIZE:,}], got {k}")
    seed = _number(args, "seed", int, optional=True)
    _kind(args.input, "--input")
    side, _ = check_output(out, inputs=[args.input], overwrite=args.overwrite)
    names, types, bits = read_boolean_table(args.input)
    key = key_from_test_seed(seed) if seed is not None else fresh_key()
    result = sample_boolean(bits, synthetic_size=k, key=key, allow_not_dp=args.allow_not_dp, **params)
    meta = sidecar(result, names=names, reproducible_seed=seed is not None)

    folder = os.path.dirname(os.path.abspath(out))
    tmp_table = tmp_side = None
    try:
        import hashlib
        import io

        buf = io.BytesIO()
        _write_table(buf, kind, names, types, result.rows)
        meta["table_sha256"] = hashlib.sha256(buf.getvalue()).hexdigest()
        tmp_table, table_inode = _write_temp(folder, out, buf.getvalue())
        tmp_side, side_inode = _write_temp(folder, side, (json.dumps(meta, indent=2) + "\n").encode())
        # nothing foreign appeared meanwhile; what stands there now is ours to replace, and only that
        _, ours = check_output(out, inputs=[args.input], overwrite=args.overwrite)
        _check_ours(tmp_side, side_inode)  # both temp files still ours before either is published
        _replace_ours(tmp_table, table_inode, out, out in ours)
        try:
            _replace_ours(tmp_side, side_inode, side, side in ours)  # the sidecar last: it means the table is complete
        except BaseException:
            with contextlib.suppress(OSError):  # a new table of ours, without its sidecar: not left behind
                if out not in ours and os.stat(out, follow_symlinks=False).st_ino == table_inode:
                    os.remove(out)
            raise
    except FileNotFoundError:
        raise PrivateSamplingError(f"--output {out}: folder {folder} does not exist") from None
    except PublishError as err:  # a file appeared at OUTPUT or OUTPUT.json while the sample was written
        raise PrivateSamplingError(str(err)) from None
    except OSError as err:
        why = err.strerror or str(err) or type(err).__name__
        raise PrivateSamplingError(f"--output {out}: cannot write ({why})") from None
    finally:
        for tmp in (tmp_table, tmp_side):
            if tmp is not None and os.path.lexists(tmp):
                os.remove(tmp)
    print(json.dumps({"output": out, "sidecar": side, "rows": meta["rows"], "dp": meta["dp"], "reason": result.reason}))
    if not result.dp:
        print(f"dpcda: warning: {result.reason}; written because of --allow-not-dp", file=sys.stderr)
    return 0
