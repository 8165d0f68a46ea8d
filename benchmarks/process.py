"""A command run in its own process, measured: wall seconds and the peak resident memory of that process, with a
time limit.

The peak is the ``ru_maxrss`` that ``os.wait4`` reports for the command, taken by a small launcher process (a bare
Python that starts the command and waits for it): Linux carries the high-water mark of the process that spawned a
command over its exec, so the command is spawned from the launcher (a few MB) rather than from the benchmark (whose
own memory would otherwise be the floor of every figure).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Optional

# argv: the file to write the peak RSS (KiB) to, then the command; exits with the command's status
LAUNCHER = (
    "import os, sys\n"
    "pid = os.posix_spawnp(sys.argv[2], sys.argv[2:], os.environ)\n"
    "_, status, usage = os.wait4(pid, 0)\n"
    "open(sys.argv[1], 'x').write(str(usage.ru_maxrss))\n"
    "sys.exit(os.waitstatus_to_exitcode(status) % 256)\n"
)


@dataclasses.dataclass
class Measured:
    returncode: int
    seconds: float
    peak_rss_mb: float
    stdout: str
    stderr: str


class TimedOut(Exception):
    """The command ran past its time limit (it and its launcher were killed)."""


def run_measured(cmd: list[str], timeout: Optional[float] = None, env: Optional[dict] = None) -> Measured:
    """Run ``cmd`` (stdout and stderr to temporary files, so a chatty command never blocks on a full pipe) and measure
    it; TimedOut past ``timeout`` seconds."""
    with tempfile.TemporaryDirectory() as tmp:
        rss = os.path.join(tmp, "rss")
        out, err = open(os.path.join(tmp, "out"), "w+"), open(os.path.join(tmp, "err"), "w+")
        with out, err:
            t0 = time.time()
            proc = subprocess.Popen(
                [sys.executable, "-c", LAUNCHER, rss, *cmd], stdout=out, stderr=err, env=env, start_new_session=True
            )
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise TimedOut(f"did not finish in {timeout:g} s") from None
            seconds = time.time() - t0
            out.seek(0)
            err.seek(0)
            stdout, stderr = out.read(), err.read()
        peak = int(open(rss).read()) / 1024.0 if os.path.exists(rss) else float("nan")
        return Measured(proc.returncode, seconds, peak, stdout, stderr)
