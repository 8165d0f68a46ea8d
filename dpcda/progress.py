"""Progress of long work, on stderr: a live bar on a terminal, plain log lines anywhere else.

``track(what, total, unit=...)`` is used by every long stage (the evaluation's training, AIM's rounds, the marginals'
and the mixers' rows, p3gm's training steps, the audit's trials). Its ``update(n)`` is called once per batch, round
or chunk, never per row. Where it writes depends on ``mode``, else on ``DPCDA_PROGRESS``, else on stderr:

- ``bar``: a tqdm bar (carriage-return frames, for a person watching a terminal); the default when stderr is a TTY;
- ``lines``: one plain line each time another tenth of the total is done (at most ten per stage, no carriage
  return), with what, done/total, rate and eta; the default when stderr is not a TTY (a file a scheduler keeps:
  Airflow, cron, Cloud Logging);
- ``off``: nothing.

Nothing is written to stdout (the CLI's JSON summaries go there). Only public quantities are reported: planned row
and step counts, rounds, trials, budget shares, and figures of the released data's own training.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
import time
from typing import Optional

ENV = "DPCDA_PROGRESS"
MODES = ("bar", "lines", "off")
log = logging.getLogger(__name__)


def chosen_mode(mode: Optional[str] = None, stream=None) -> str:
    """``mode`` if given, else ``DPCDA_PROGRESS`` if set (an unknown value is named on stderr once and ignored), else
    ``bar`` when ``stream`` (stderr) is a TTY and ``lines`` when it is not."""
    stream = sys.stderr if stream is None else stream
    if mode is None:
        mode = os.environ.get(ENV, "").strip().lower() or None
        if mode is not None and mode not in MODES:
            _warn_once(f"dpcda: warning: {ENV}={mode!r} is not one of {', '.join(MODES)}; choosing by the terminal")
            mode = None
    if mode is None:
        isatty = getattr(stream, "isatty", None)
        return "bar" if isatty is not None and isatty() else "lines"
    if mode not in MODES:
        raise ValueError(f"progress mode must be one of {', '.join(MODES)}, got {mode!r}")
    return mode


_warned: set = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        print(message, file=sys.stderr, flush=True)


class _Off:
    """Counts nothing, writes nothing."""

    def update(self, n: float = 1, **postfix) -> None:
        pass

    def set(self, done: float, **postfix) -> None:
        pass

    def set_postfix(self, **postfix) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Lines(_Off):
    """One line per tenth of the total crossed (the first update past 10 %, 20 %, ...), flushed, no carriage return."""

    def __init__(self, what: str, total: float, unit: str, stream):
        self.what, self.total, self.unit, self.stream = what, float(total), unit, stream
        self.done, self.postfix, self.start = 0.0, {}, time.monotonic()
        self.next_at = self._threshold(1)  # the next tenth that writes a line
        self.tenths = 0
        self.lock = threading.Lock()  # a Beam worker may update one tracker from several threads

    def _threshold(self, tenth: int) -> float:
        return self.total * tenth / 10 if self.total > 0 else 0.0

    def update(self, n: float = 1, **postfix) -> None:
        with self.lock:
            self.done += n
            self._maybe_write(postfix)

    def set(self, done: float, **postfix) -> None:
        with self.lock:
            self.done = float(done)
            self._maybe_write(postfix)

    def set_postfix(self, **postfix) -> None:
        self.postfix = {**self.postfix, **postfix}

    def _maybe_write(self, postfix: dict) -> None:
        if postfix:
            self.postfix = {**self.postfix, **postfix}
        if self.tenths >= 10 or self.done < self.next_at:
            return
        self.tenths = min(10, int(10 * self.done / self.total)) if self.total > 0 else 10
        self.next_at = self._threshold(self.tenths + 1)
        self._write(self.line())

    def _write(self, line: str) -> None:
        """To the stream given; else a log record where logging shows this module's INFO records (the CLI's and a
        Beam worker's set-up: the scheduler's log keeps one format, its timestamp and severity); else to stderr."""
        if self.stream is None and log.isEnabledFor(logging.INFO) and log.hasHandlers():
            log.info("%s", line)
            return
        stream = sys.stderr if self.stream is None else self.stream
        stream.write(f"dpcda: {line}\n")
        stream.flush()

    def line(self) -> str:
        done = min(self.done, self.total)
        elapsed = max(time.monotonic() - self.start, 1e-9)
        rate = done / elapsed
        eta = (self.total - done) / rate if rate > 0 else math.inf
        pct = 100.0 * done / self.total if self.total > 0 else 100.0
        extra = "".join(f" {k}={v}" for k, v in self.postfix.items())
        return (
            f"progress: {self.what}: {_number(done)}/{_number(self.total)} {self.unit} ({pct:.0f}%) "
            f"rate={_number(rate)} {self.unit}/s elapsed={_clock(elapsed)} eta={_clock(eta)}{extra}"
        )


def _number(x: float) -> str:
    if x >= 100 or float(x).is_integer():
        return f"{round(x):,}"
    return f"{x:.3g}"


def _clock(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


class _Bar(_Off):
    """tqdm on the terminal (stderr), cleared when the stage ends."""

    def __init__(self, what: str, total: float, unit: str, stream):
        from tqdm import tqdm

        self.bar = tqdm(
            total=total, desc=what, unit=unit, unit_scale=True, file=stream, leave=False, dynamic_ncols=True
        )

    def update(self, n: float = 1, **postfix) -> None:
        if postfix:
            self.bar.set_postfix(postfix, refresh=False)
        self.bar.update(n)

    def set(self, done: float, **postfix) -> None:
        self.update(done - self.bar.n, **postfix)

    def set_postfix(self, **postfix) -> None:
        self.bar.set_postfix(postfix)

    def close(self) -> None:
        self.bar.close()


def track(what: str, total: float, *, unit: str = "it", mode: Optional[str] = None, stream=None):
    """A tracker of ``total`` units of work called ``what`` (a context manager; ``update(n, **postfix)`` adds ``n``
    done, ``set(done)`` moves to ``done``, ``set_postfix(**kw)`` shows public figures beside it, ``close()`` ends
    it). ``mode``: ``bar``, ``lines`` or ``off`` (else ``DPCDA_PROGRESS``, else by whether stderr is a TTY).
    ``stream``: where to write (default stderr; lines go through logging where it shows INFO records)."""
    kind = chosen_mode(mode, stream)
    if kind == "off":
        return _Off()
    if kind == "bar":
        return _Bar(what, total, unit, sys.stderr if stream is None else stream)
    return _Lines(what, total, unit, stream)


def step_callback(what: str, *, unit: str = "steps", mode: Optional[str] = None):
    """A ``progress(step, steps, loss)`` callback (p3gm's training) that tracks ``step`` of ``steps`` and never
    shows the loss (a statistic of private rows, not DP); the tracker is made at the first call and closed at the
    last step."""
    state: dict = {}

    def progress(step: int, steps: int, _loss: float) -> None:
        if "bar" not in state:
            state["bar"] = track(what, steps, unit=unit, mode=mode)
        state["bar"].set(step)
        if step >= steps:
            state.pop("bar").close()

    return progress
