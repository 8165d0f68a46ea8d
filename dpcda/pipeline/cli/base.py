"""What every ``dpcda`` subcommand shares: exit codes, one-line errors, the parser, logging."""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys

EXIT_BAD_INPUT = 2

EXIT_SIGINT, EXIT_SIGTERM = 130, 143
_PUBLISHED: list[str] = []  # what the running command has published for good (``published``)


def published(what: str) -> None:
    """The running command's output is published for good (``what`` names it, e.g. "the release at OUT"): an
    interrupt from here on ends the command saying that it WAS published and is complete, not that nothing was."""
    _PUBLISHED.append(what)


_KNOWN = (
    "InputError",
    "PlanError",
    "CalibrationError",
    "ConfigError",
    "ReleaseError",
    "PrepareError",
    "PublishError",
    "EvaluationError",
    "AccountingError",
    "AuditError",
    "SchemaError",
    "RiskError",
    "RowDependenceError",
    "LedgerError",
    "FeasibilityError",
    "PrivateSamplingError",
    "SampleError",
    "ModelError",
    "UnknownMechanism",
    "DuplicateKey",
    "ClaimError",
    "FilterError",
)  # every DpcdaError subclass, by name (a worker's error reaches the launcher as text; tests/test_errors.py checks)


_PATTERN = re.compile(r"(?:^|\W)(%s): (.+)" % "|".join(_KNOWN))


_BEAM_SUFFIX = re.compile(r" \[while running '.*$")


def one_line_error(err: BaseException) -> str | None:
    """The user-facing line of a user error (a ``DpcdaError``), also when Beam wrapped it in its own.

    Beam re-raises a DoFn's exception with `` [while running 'Step']`` appended; across worker processes only its
    text survives (inside a traceback), so the class names of our errors are also looked for in the text.
    """
    from dpcda.privacy.errors import DpcdaError

    seen = err
    while seen is not None:
        if isinstance(seen, DpcdaError) or type(seen).__name__ in _KNOWN:
            lines = str(seen).splitlines() or [type(seen).__name__]
            return _BEAM_SUFFIX.sub("", lines[0]).strip()
        seen = seen.__cause__ or seen.__context__
    matches = _PATTERN.findall(str(err))
    if matches:
        msg = matches[-1][1].strip()
        return _BEAM_SUFFIX.sub("", msg).rstrip("'\" ")
    return None


def _setup_logging() -> None:
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    for noisy in ("absl", "apache_beam", "urllib3", "google"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    # Beam logs a DoFn's exception with its traceback before re-raising it; the CLI boundary below
    # reports it (one line for bad input, the full traceback otherwise), so the log copy is noise.
    logging.getLogger("apache_beam.runners.common").setLevel(logging.CRITICAL)
    logging.getLogger("apache_beam.runners.dataflow").setLevel(logging.INFO)  # job state, for the operator
    logging.getLogger("dpcda").setLevel(logging.INFO)  # the package's loggers: dpcda.release, dpcda.evaluation...


class _OneLineParser(argparse.ArgumentParser):
    """argparse's errors as the CLI's other errors: one ``dpcda: error:`` line and exit status 2 (not the usage)."""

    def error(self, message):
        sub = self.prog.split(" ", 1)[1] + ": " if " " in self.prog else ""
        print(f"dpcda: error: {sub}{message.splitlines()[0] if message else ''}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)


_NEGATIVE = re.compile(r"^-(\d|\.\d)")


def _join_negative_values(argv: list[str]) -> list[str]:
    """``--flag -1,1`` as ``--flag=-1,1``: argparse takes a value starting with '-' for an option unless it is a
    plain number, so a negative bound list needed the '=' form."""
    out: list[str] = []
    for tok in argv:
        if out and _NEGATIVE.match(tok) and out[-1].startswith("--") and "=" not in out[-1]:
            out[-1] = f"{out[-1]}={tok}"
        else:
            out.append(tok)
    return out


# the options that take one path or glob pattern (release, schema infer, evaluate, audit-release, sample-boolean...)
GLOB_FLAGS = ("--input", "--eval-input", "--test", "--train", "--holdout")


def expanded_glob(argv: list[str]) -> str | None:
    """One line for an option that takes one pattern but was given several existing paths, as when the shell
    expands an unquoted ``--input data/train/*.parquet`` (the paths after the first would otherwise read as unknown
    options or Beam options); None when there is none. Only local paths that exist count: nothing else is a shell's
    expansion."""
    for i, tok in enumerate(argv):
        if tok not in GLOB_FLAGS:
            continue
        paths = []
        for word in argv[i + 1 :]:
            if word.startswith("-") or not os.path.lexists(word):
                break
            paths.append(word)
        if len(paths) < 2:
            continue
        folder = os.path.commonpath([os.path.dirname(p) or "." for p in paths])
        exts = {os.path.splitext(p)[1] for p in paths}
        pattern = os.path.join(folder, "*" + (exts.pop() if len(exts) == 1 else ""))
        return (
            f"{tok} takes one path or pattern but got {len(paths)} paths ({paths[0]}, {paths[1]}"
            f"{', ...' if len(paths) > 2 else ''}): the shell expanded an unquoted pattern; quote it, e.g. "
            f"{tok} '{pattern}'"
        )
    return None


def repeated_option(argv: list[str], flags) -> str | None:
    """One line for an option of ``flags`` given twice (``--config A --config B``: argparse would keep B and drop A
    without a word); None when each is given once at most."""
    seen: dict = {}
    for tok in argv:
        flag = tok.split("=", 1)[0]
        if flag in flags:
            seen[flag] = seen.get(flag, 0) + 1
            if seen[flag] == 2:
                return f"{flag} is given twice; give one config file (it holds every field; flags override it)"
    return None
