"""``dpcda``: prepare, release, account, evaluate, audit.

Bad input or config ends with one line on stderr that names the file, column, row or field, and a
non-zero exit status (2). Unknown flags of ``release`` are Beam pipeline options.

One module per subcommand (``prepare``, ``risk``, ``schema``, ``release``, ``ledger``, ``account``, ``evaluate``,
``audit``, ``sample``, ``sampling``), each with a ``register(sub)`` that adds its parsers and returns its handlers;
``base`` holds what they share (exit codes, one-line errors, the parser class, logging).
"""

from __future__ import annotations

import signal
import sys

from dpcda.pipeline.cli import account, audit, evaluate, ledger, prepare, release, risk, sample, sampling, schema
from dpcda.pipeline.cli.base import (
    _KNOWN,
    _PUBLISHED,
    EXIT_BAD_INPUT,
    EXIT_SIGINT,
    EXIT_SIGTERM,
    _join_negative_values,
    _OneLineParser,
    _setup_logging,
    expanded_glob,
    one_line_error,
    repeated_option,
)
from dpcda.pipeline.cli.release import release_flags
from dpcda.pipeline.cli.schema import SCHEMA_NOTE, _our_draft

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_SIGINT",
    "EXIT_SIGTERM",
    "SCHEMA_NOTE",
    "_KNOWN",
    "_join_negative_values",
    "_our_draft",
    "build_parser",
    "main",
    "one_line_error",
    "release_flags",
]

# the subcommands in the order ``dpcda --help`` lists them
SUBCOMMANDS = (prepare, risk, schema, release, ledger, account, evaluate, audit, sample, sampling)
COMMANDS: dict = {}


def build_parser():
    parser = _OneLineParser(prog="dpcda", description=__doc__.splitlines()[0], allow_abbrev=False)
    sub = parser.add_subparsers(dest="command", required=True)
    for module in SUBCOMMANDS:
        COMMANDS.update(module.register(sub))
    return parser


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the program is, so that the same clean-up as for Ctrl-C runs."""


_SIGNAL_SEEN: list[int] = []


def _on_signal(signum, _frame):
    _SIGNAL_SEEN.append(signum)
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def _interrupted(err: BaseException) -> bool:
    seen = err
    while seen is not None:
        if isinstance(seen, KeyboardInterrupt):
            return True
        seen = seen.__cause__ or seen.__context__
    return bool(_SIGNAL_SEEN) or "KeyboardInterrupt" in str(err)


def main(argv=None) -> int:
    """Runs one ``dpcda`` command; returns its exit status. SIGINT and SIGTERM raise where the program is, so that the
    command cleans up and ends in one line (130 or 143); after a release is published, that line says it WAS."""
    parser = build_parser()
    argv = _join_negative_values(list(sys.argv[1:] if argv is None else argv))
    expanded = expanded_glob(argv)  # before parsing: the extra paths would read as unknown (or Beam) options
    if expanded is not None:
        print(f"dpcda: error: {expanded}", file=sys.stderr)
        return EXIT_BAD_INPUT
    args, extra = parser.parse_known_args(argv)
    if extra and args.command != "release":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    repeated = repeated_option(argv, ("--config",)) if args.command == "release" else None
    if repeated is not None:  # argparse keeps the last and drops the others without a word (a flag given again
        # overrides, as documented: a wrapper's defaults, then the user's; two config files are not merged)
        print(f"dpcda: error: release: {repeated}", file=sys.stderr)
        return EXIT_BAD_INPUT
    _setup_logging()
    _SIGNAL_SEEN.clear()
    _PUBLISHED.clear()
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    for s in previous:
        signal.signal(s, _on_signal)
    try:
        return COMMANDS[args.command](args, extra)
    except BaseException as err:  # noqa: BLE001 - the CLI boundary: one line for known errors and interrupts
        if isinstance(err, SystemExit):
            raise
        if _interrupted(err):
            term = signal.SIGTERM in _SIGNAL_SEEN or isinstance(err, Terminated)
            if _PUBLISHED:  # after the command published: only its last steps (the ledger, a log line, the summary)
                note = getattr(err, "ledger_note", None)
                done = f"{_PUBLISHED[-1]} WAS published and is complete" + (f"; {note}" if note else "")
            elif getattr(err, "published", False):
                done = "the release WAS published; what is left of the old one goes with the next run"
            else:
                done = "nothing was published"
            print(f"dpcda: {'terminated (SIGTERM)' if term else 'interrupted'}; {done}", file=sys.stderr)
            return EXIT_SIGTERM if term else EXIT_SIGINT
        msg = one_line_error(err)
        if msg is None:
            raise
        print(f"dpcda: error: {msg}", file=sys.stderr)
        return EXIT_BAD_INPUT
    finally:
        _PUBLISHED.clear()
        for s, handler in previous.items():
            signal.signal(s, handler)
