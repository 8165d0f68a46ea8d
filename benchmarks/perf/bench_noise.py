"""Exact Gaussians/s and keystream GB/s of the noise package beside numpy's two generators and torch, one process per
row, paired per repeat.

    python -m benchmarks.perf.bench_noise --host-only --threads 1 2 --repeat 15 --out benchmarks/results/bench_noise.md
    python -m benchmarks.perf.bench_noise                       # CPU: 1 thread and all cores, host and torch paths
    python -m benchmarks.perf.bench_noise --device cuda         # the torch paths on the card
    python -m benchmarks.perf.bench_noise --host-only --against 4a40fe7   # adds the exact Gaussian of a revision

Every row runs in a process of its own (``benchmarks/perf/noise_rows.py``), started before any timing and warmed by
one untimed call, so no row warms another's caches, threads, compiled sampler or torch kernels. Each repeat asks
every row for one timed call, in turn, in an order that alternates (forwards in even repeats, backwards in odd ones),
so a busy spell of the machine hits all rows alike. A row's rate is its median; its ratio to a reference row is the
median, over the repeats, of the ratio of the two rates timed in the same repeat (with their range).

Rows (at each thread count; ``threads`` noise threads, numpy generators or torch threads):
- ``numpy default_rng standard_normal``: numpy's ``Generator`` (PCG64, float64 ziggurat), one per thread: the
  reference (not exact, not secure);
- ``numpy legacy standard_normal``: ``RandomState`` (what ``np.random.standard_normal`` calls, the polar method),
  one per thread;
- ``torch.randn``: float64 on the device;
- ``host exact Gaussian``: ``NoiseStream.gaussian``, OpenSSL words and the compiled sampler (``privacy.noise.native``),
  and the same with the numpy sampler (``DPCDA_NOISE_NATIVE=0``: what runs where no C compiler is present);
  ``host keystream``: ``NoiseStream.fill``; the samplers alone on words already drawn, one thread;
- ``torch exact Gaussian, host words``: ``NoiseStream(..., device="cpu")``: OpenSSL words, the sampler in torch
  (eager, or compiled with ``torch.compile``);
- ``torch exact Gaussian, device words``: ChaCha20 and the sampler both in torch (``privacy.noise.device``).
``--against REV``: the two host exact Gaussian rows again, drawn by git revision REV's ``dpcda`` (checked out in a
temporary worktree), paired with this tree's in the same repeats.

The header names the CPU, the flags of its vector units that matter here and the load average before and after.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from importlib import metadata
from typing import Optional

from benchmarks.files import ROOT, write_text
from benchmarks.paired import revision_tree

WORKER = os.path.join(ROOT, "benchmarks", "perf", "noise_rows.py")
FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")
NUMPY = "numpy default_rng standard_normal (float64)"
LEGACY = "numpy legacy standard_normal (RandomState, float64)"
RANDN = "torch.randn (float64)"
HOST = "host exact Gaussian (OpenSSL + compiled sampler)"
HOST_NUMPY = "host exact Gaussian (OpenSSL + numpy sampler)"


@dataclass
class Row:
    """One row: what its process draws (``kind``, see ``noise_rows.build``), how, and the times it measured."""

    path: str
    kind: str
    threads: object  # an int, or "device"
    n: int
    gaussians: int = 0  # draws per call (0: a keystream row)
    nbytes: int = 0  # keystream bytes per call
    threaded: bool = True  # False: one thread whatever the count (no speed-up to state)
    env: dict = field(default_factory=dict)
    tree: Optional[str] = None  # another revision's tree (--against), else this one
    times: list = field(default_factory=list)
    starts: list = field(default_factory=list)  # wall-clock start of each timed call
    info: dict = field(default_factory=dict)
    warm_s: float = 0.0
    error: str = ""


def plan(args, threads: int, device: str) -> list:
    """The rows at one thread count."""
    n = args.n
    rows = []
    cpu = device == "cpu"
    t = threads if cpu else "device"
    if cpu:
        rows.append(Row(NUMPY, "numpy", t, n, gaussians=n))
        rows.append(Row(LEGACY, "legacy", t, n, gaussians=n))
    rows.append(Row(RANDN, "randn", t, n, gaussians=n))
    if cpu:
        rows.append(Row(HOST, "host", t, n, gaussians=n))
        rows.append(Row(HOST_NUMPY, "host", t, n, gaussians=n, env={"DPCDA_NOISE_NATIVE": "0"}))
        rows.append(Row("host keystream (OpenSSL)", "keystream", t, n, nbytes=24 * n))
        if threads == 1:  # one thread at every count: measured once
            for label, kind in (("compiled", "sampler-compiled"), ("numpy", "sampler-numpy")):
                name = f"host sampler alone, 1 thread ({label}, words given)"
                rows.append(Row(name, kind, 1, n, gaussians=n, threaded=False))
    modes = [("eager", "0")] + ([] if args.no_compile else [("compiled", "1")])
    for label, flag in [] if (args.host_only and cpu) else modes:
        env = {"DPCDA_NOISE_COMPILE": flag}
        if cpu:
            rows.append(
                Row(f"torch exact Gaussian, host words ({label})", "torch-host-words", t, n, gaussians=n, env=env)
            )
        m = n if (label == "compiled" or not cpu) else max(n // 8, 1)  # eager torch ChaCha20 on a CPU is slow
        rows.append(
            Row(f"torch exact Gaussian, device words ({label})", "torch-device-words", t, m, gaussians=m, env=env)
        )
        rows.append(Row(f"torch keystream (ChaCha20, {label})", "torch-keystream", t, m, nbytes=24 * m, env=env))
    return rows


class Worker:
    """A row's process (``noise_rows.py``): started, warmed, then one timed call per ``time()``."""

    def __init__(self, row: Row, device: str, scratch: str):
        self.row = row
        env = dict(os.environ, **row.env)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (row.tree or ROOT, os.environ.get("PYTHONPATH")) if p)
        self.err = tempfile.NamedTemporaryFile("w+", dir=scratch, suffix=".log", delete=False)
        args = [sys.executable, WORKER, row.kind, str(row.threads if row.threads != "device" else 1), str(row.n)]
        self.proc = subprocess.Popen(
            [*args, device], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err, text=True, env=env
        )

    def read_reply(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            self.err.seek(0)
            tail = " ".join(self.err.read().strip().splitlines()[-3:])
            raise RuntimeError(f"exit {self.proc.returncode}: {tail[-400:]}")
        return json.loads(line)

    def ready(self) -> None:
        try:
            got = self.read_reply()
            self.row.info, self.row.warm_s = got["info"], got["warm_s"]
        except RuntimeError as err:
            self.row.error = str(err)
            return
        tree = os.path.realpath(os.path.join(self.row.tree or ROOT, "dpcda"))
        if "dpcda" in self.row.info and os.path.realpath(self.row.info["dpcda"]) != tree:
            self.row.error = f"drew with {self.row.info['dpcda']}, not {tree}"

    def time(self) -> None:
        if self.row.error:
            return
        try:
            self.proc.stdin.write("time\n")
            self.proc.stdin.flush()
            got = self.read_reply()
            self.row.times.append(got["s"])
            self.row.starts.append(got["at"])
        except (RuntimeError, OSError) as err:
            self.row.error = str(err)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.err.close()


def run_rows(rows: list, repeat: int, device: str) -> None:
    """Every row in its own process, all started (and warmed) first; then ``repeat`` repeats, each timing every row
    once, forwards in even repeats and backwards in odd ones."""
    with tempfile.TemporaryDirectory(prefix="bench-noise-") as scratch:
        workers = [Worker(r, device, scratch) for r in rows]
        try:
            for w in workers:
                w.ready()
            for i in range(repeat):
                for w in workers if i % 2 == 0 else workers[::-1]:
                    w.time()
        finally:
            for w in workers:
                w.close()


def rate(row: Row, secs: float) -> float:
    return (row.gaussians or row.nbytes) / secs


def paired(row: Row, ref: Optional[Row]) -> Optional[list]:
    """Per repeat, ``row``'s rate over ``ref``'s rate, both timed in that repeat (sorted); None without both."""
    if ref is None or ref is row or not row.gaussians or not (row.times and ref.times):
        return None
    return sorted(rate(row, a) / rate(ref, b) for a, b in zip(row.times, ref.times))


def ratio_cell(ratios: Optional[list]) -> str:
    if not ratios:
        return ""
    if len(ratios) == 1:
        return f"{ratios[0]:.2f}x"
    return f"{statistics.median(ratios):.2f}x ({ratios[0]:.2f}-{ratios[-1]:.2f})"


def table(rows: list) -> str:
    """Each row's median rate and its paired ratios to numpy's two generators and torch.randn at its thread count."""
    lines = [
        "| path | threads | exact Gaussians/s (M) | keystream GB/s | vs numpy default_rng | vs numpy legacy "
        "| vs torch.randn |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    refs = {name: {r.threads: r for r in rows if r.path == name and r.tree is None} for name in (NUMPY, LEGACY, RANDN)}
    for r in rows:
        if r.tree is not None:
            continue
        if r.error or not r.times:
            lines.append(f"| {r.path} | {r.threads} | failed: {r.error or 'no time'} |  |  |  |  |")
            continue
        secs = statistics.median(r.times)
        gps = f"{r.gaussians / secs / 1e6:.2f}" if r.gaussians else ""
        gbs = f"{r.nbytes / secs / 1e9:.3f}" if r.nbytes else ""
        cells = [
            "1.00x" if refs[name].get(r.threads) is r else ratio_cell(paired(r, refs[name].get(r.threads)))
            for name in (NUMPY, LEGACY, RANDN)
        ]
        lines.append(f"| {_label(r)} | {r.threads} | {gps} | {gbs} | {' | '.join(cells)} |")
    return "\n".join(lines)


def _label(r: Row) -> str:
    """The row's name, with what actually ran where it is not what the name says."""
    if r.kind == "host" and "DPCDA_NOISE_NATIVE" not in r.env and r.info.get("sampler", "compiled") != "compiled":
        return f"{r.path}: not compiled here ({r.info['sampler']}), numpy ran"
    if "compiled" in r.path and r.info.get("backend") == "eager":
        return f"{r.path}: torch.compile failed, eager ran"
    return r.path


def against_table(rows: list, rev: str) -> str:
    """This tree's host rows beside revision ``rev``'s, paired per repeat."""
    lines = [
        f"| path | threads | this tree (M/s) | {rev} (M/s) | this tree / {rev} |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        if r.tree is None:
            continue
        mine = next(m for m in rows if m.tree is None and m.path == r.path and m.threads == r.threads)
        if r.error or mine.error:
            lines.append(f"| {r.path} | {r.threads} | failed: {mine.error or r.error} |  |  |")
            continue
        here, there = (statistics.median(x.times) for x in (mine, r))
        cell = ratio_cell(paired(mine, r))
        lines.append(
            f"| {r.path} | {r.threads} | {mine.gaussians / here / 1e6:.2f} | {r.gaussians / there / 1e6:.2f} | {cell} |"
        )
    return "\n".join(lines)


def speed_ups(rows: list, top: int) -> list:
    """Each threaded path's ``top``-thread speed-up over its one-thread figure, paired: repeat i's one-thread time over
    repeat i's ``top``-thread time (both timed within repeat i), the median of those ratios and their range. Rows
    that run one thread at every count are left out. ``rows``: dicts with path, threads, times and threaded."""
    one = {r["path"]: r for r in rows if r["threads"] == 1 and r["threaded"]}
    lines = []
    for r in rows:
        if r["threads"] == top and r["path"] in one:
            ratios = sorted(a / b for a, b in zip(one[r["path"]]["times"], r["times"]))
            lines.append(
                f"- {r['path']}: {statistics.median(ratios):.2f}x (per repeat {ratios[0]:.2f}x to {ratios[-1]:.2f}x)"
            )
    return lines


def cpu_line(cores: int) -> str:
    """The CPU's model, whether it has the vector units that matter here (avx2, avx512f, avx512_bf16, amx), and the
    cores this process may use."""
    model, flags = "unknown CPU", set()
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and model == "unknown CPU":
                    model = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = set(value.split())
    have = [f"{f} {'yes' if f in flags else 'no'}" for f in FLAGS]
    return f"CPU: {model}; {', '.join(have)}; {cores} cores for this process"


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "absent"


def cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10_000_000, help="Gaussians per timed call")
    ap.add_argument("--repeat", type=int, default=5, help="timed calls per row (the median is reported)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--threads", type=int, nargs="+", default=None, help="CPU thread counts (default: 1 and all)")
    ap.add_argument("--no-compile", action="store_true", help="eager torch kernels only")
    ap.add_argument("--host-only", action="store_true", help="numpy, torch.randn and the host paths only (CPU)")
    ap.add_argument("--against", default=None, help="git revision whose host exact Gaussian rows run beside these")
    ap.add_argument("--out", default=None, help="also write the report (markdown) to this file")
    args = ap.parse_args(argv)
    ncores = cores()
    counts = (args.threads or sorted({1, ncores})) if args.device == "cpu" else [1]
    rows = [r for t in counts for r in plan(args, t, args.device)]
    before = os.getloadavg()
    with contextlib.ExitStack() as stack:
        if args.against:
            tree, _ = stack.enter_context(revision_tree(args.against, prefix="bench-noise-"))
            rows += [
                Row(r.path, r.kind, r.threads, r.n, gaussians=r.gaussians, env=r.env, tree=tree)
                for r in rows
                if r.kind == "host"
            ]
        run_rows(rows, args.repeat, args.device)
    after = os.getloadavg()
    device_name = next((r.info["device_name"] for r in rows if "device_name" in r.info), None)
    compiled = [r for r in rows if r.tree is None and r.env.get("DPCDA_NOISE_COMPILE") == "1"]
    first_call = "; ".join(f"{_label(r)} {r.warm_s:.1f}" for r in compiled)
    head = [
        cpu_line(ncores) + (f"; device: {device_name}" if device_name else ""),
        f"numpy {_version('numpy')}, torch {_version('torch')}, cryptography {_version('cryptography')}; "
        f"{args.n:,} draws per call; median of {args.repeat} repeats; each row in a process of its own, warmed by one "
        "untimed call; rows timed in turn, the order alternating by repeat; ratios: median of the per-repeat paired "
        "ratios (range)",
        "load average (1, 5, 15 min): "
        + ", ".join(f"{x:.2f}" for x in before)
        + " before; "
        + ", ".join(f"{x:.2f}" for x in after)
        + " after",
    ]
    if first_call:
        head.append(f"first (untimed) call of the compiled torch rows, seconds (compiling included): {first_call}")
    text = "\n".join(f"- {h}" for h in head) + "\n\n" + table(rows)
    if args.device == "cpu" and len(counts) > 1:
        top = max(counts)
        mine = [
            dict(path=r.path, threads=r.threads, times=r.times, threaded=r.threaded) for r in rows if r.tree is None
        ]
        text += f"\n\nSpeed-up, {top} threads over 1 (median of the repeats' paired ratios):\n"
        text += "\n".join(speed_ups(mine, top))
    if args.against:
        text += (
            f"\n\nThis tree against {args.against} (the same rows from that revision's tree, paired per repeat):\n\n"
        )
        text += against_table(rows, args.against)
    print(text)
    if args.out:
        cmd = "python -m benchmarks.perf.bench_noise " + " ".join(argv if argv is not None else sys.argv[1:])
        write_text(args.out, f"Generated by `{cmd.strip()}`.\n\n{text}\n")


if __name__ == "__main__":
    main()
