"""Exact Gaussians/s and keystream GB/s of the noise module, per core and with all cores, beside numpy and torch.

    python -m benchmarks.perf.bench_noise                       # CPU: 1 thread and all cores, host and torch paths
    python -m benchmarks.perf.bench_noise --device cuda         # adds the torch path with words made on the card
    python -m benchmarks.perf.bench_noise --out benchmarks/results/bench_noise.md
    python -m benchmarks.perf.bench_noise --host-only           # numpy and the host paths only (a minute, not ten)

Rows, each measured in this run: every repeat times each row once, in turn (so a busy spell of the machine hits
every row alike), and the table gives each row's median:
- ``numpy standard_normal``: numpy's float64 ziggurat (not exact, not secure), one generator per thread;
- ``torch.randn``: float64 on the device (torch's own threads);
- ``host``: ``NoiseStream.gaussian`` on ``threads`` noise threads, OpenSSL words and the compiled sampler
  (``privacy.noise.native``), and the same with the numpy sampler (what runs where no C compiler is present);
  keystream: ``NoiseStream.words``; the samplers alone on words already drawn;
- ``torch (host words)``: ``NoiseStream(..., device="cpu")``: OpenSSL words, the sampler in torch (eager or
  compiled with ``torch.compile``) on ``threads`` torch threads;
- ``torch (device words)``: ChaCha20 and the sampler both in torch (``privacy.noise.device``), eager or compiled.
Ratios are against numpy's standard_normal with the same thread count (CPU) and against torch.randn on the device.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time

import numpy as np
import torch

from benchmarks.files import write_text
from dpcda.privacy import noise
from dpcda.privacy.noise import NoiseStream, key_from_test_seed
from dpcda.privacy.noise import device as noise_device
from dpcda.privacy.noise import native as noise_native
from dpcda.privacy.noise.gaussian import rounded_gaussian
from dpcda.privacy.noise.native_sampler import call_kernel, finish_block

KEY = key_from_test_seed(0)
CPU = torch.device("cpu")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device: torch.device = CPU) -> float:
    """Seconds of one call."""
    _sync(device)
    t = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - t


def numpy_sampler(on: bool):
    """A context: the host's numpy sampler (as on a machine without a C compiler) while ``on``."""
    import contextlib

    @contextlib.contextmanager
    def ctx():
        saved = noise_native._LIB
        if on:
            noise_native._LIB = False
        try:
            yield
        finally:
            noise_native._LIB = saved

    return ctx()


def numpy_normal(n: int, threads: int):
    gens = [np.random.default_rng(i) for i in range(threads)]
    per = -(-n // threads)

    def run():
        ts = [threading.Thread(target=g.standard_normal, args=(per,)) for g in gens]
        for t in ts:
            t.start()
        for t in ts:
            t.join()

    return run


def sampler_only(n: int, native: bool):
    """The host's per-block sampler on words already drawn (compiled, or numpy's ``rounded_gaussian``): its share
    of the cost, on one thread."""
    blk = noise.BLOCK
    words = NoiseStream(KEY, "s").words(3 * blk).reshape(3, blk)
    top = np.ascontiguousarray(words[:2]).reshape(-1)
    buf = np.zeros(2 * blk + 8, np.uint64)
    buf[: 2 * blk] = top
    center, out, dist, st = np.zeros(blk), np.empty(blk), np.empty(blk), np.empty((1, noise.STATS_PER_BLOCK))
    g = noise.grid_for(0.7)
    fn = noise.native_kernel() if native else None

    def run():
        for _ in range(0, n, blk):
            if fn is not None:
                call_kernel(fn, 1, blk, buf, 0, 2 * blk, center, out, dist, st, 0.7, g)
                finish_block(st[0], dist, center, out, top, lambda i: int(words[2, i]), 0.7, g)
            else:
                rounded_gaussian(center, 0.7, g, words)

    return run


def plan_rows(args, device: torch.device, threads: int, compiled_ok: bool) -> list[tuple]:
    """(name, threads, call, gaussians, bytes, threaded) per row at this thread count; ``run_rows`` times them.
    ``threaded``: False for a row that runs one thread whatever the count (no speed-up to state)."""
    n = args.n
    center = np.zeros(n)
    plan = []

    def row(name, fn, *, gaussians=None, nbytes=None, threaded=True):
        def call():
            noise.set_threads(threads)
            torch.set_num_threads(threads)
            fn()

        plan.append((name, threads if device.type == "cpu" else "device", call, gaussians, nbytes, threaded))

    if device.type == "cpu":
        row("numpy standard_normal (float64)", numpy_normal(n, threads), gaussians=n)
    row("torch.randn (float64)", lambda: torch.randn(n, dtype=torch.float64, device=device), gaussians=n)
    if device.type == "cpu":
        native = noise.native_kernel() is not None
        if native:
            row(
                "host exact Gaussian (OpenSSL + compiled sampler)",
                lambda: NoiseStream(KEY, "b").gaussian(center, 0.7),
                gaussians=n,
            )

        def host_numpy():
            with numpy_sampler(True):
                NoiseStream(KEY, "b").gaussian(center, 0.7)

        row("host exact Gaussian (OpenSSL + numpy sampler)", host_numpy, gaussians=n)
        # into one buffer for every call: a fresh 24n-byte array per call would time its first-touch page faults too
        # (one thread read 0.64 GB/s that way where this reads 3.3)
        keystream = np.empty(3 * n + noise.SLACK_WORDS, np.uint64)
        row("host keystream (OpenSSL)", lambda: NoiseStream(KEY, "w").fill(keystream, 3 * n), nbytes=24 * n)
        if native:
            row(
                "host sampler alone, 1 thread (compiled, words given)",
                sampler_only(n, True),
                gaussians=n,
                threaded=False,
            )
        row("host sampler alone, 1 thread (numpy, words given)", sampler_only(n, False), gaussians=n, threaded=False)
    sk = noise.subkey(KEY, ("d",))
    ct = torch.zeros(n, dtype=torch.float64, device=device)
    modes = [("eager", False)] + ([("compiled", True)] if compiled_ok else [])
    if args.host_only and device.type == "cpu":
        modes = []
    for label, compiled in modes:

        def env(fn, compiled=compiled):
            def run():
                os.environ["DPCDA_NOISE_COMPILE"] = "1" if compiled else "0"
                fn()

            return run

        if device.type == "cpu":
            row(
                f"torch exact Gaussian, host words ({label})",
                env(lambda: NoiseStream(KEY, "b", device="cpu").gaussian(ct, 0.7)),
                gaussians=n,
            )
        m = n if (compiled or device.type != "cpu") else max(n // 8, 1)  # eager torch ChaCha20 on a CPU is slow
        cm = ct[:m]
        row(
            f"torch exact Gaussian, device words ({label})",
            env(
                lambda cm=cm, compiled=compiled: noise_device.rounded_gaussian(
                    cm, 0.7, subkey=sk, start=0, compiled=compiled
                )
            ),
            gaussians=m,
        )
        row(
            f"torch keystream (ChaCha20, {label})",
            env(lambda m=m, compiled=compiled: noise_device.stream_halves(sk, 0, 3 * m, device, compiled=compiled)),
            nbytes=24 * m,
        )
    return plan


def run_rows(plan: list[tuple], repeat: int, device: torch.device) -> list[dict]:
    """Each repeat times every row once, in turn (thread counts included): a busy spell hits all rows alike. The
    median of each row's times is its figure."""
    times = [[] for _ in plan]
    for _ in range(repeat):
        for i, (_, _, call, *_) in enumerate(plan):
            times[i].append(timed(call, device))
    rows = []
    for (name, threads, _, gaussians, nbytes, threaded), ts in zip(plan, times):
        secs = statistics.median(ts)
        rows.append(
            dict(
                path=name,
                threads=threads,
                gps=gaussians / secs / 1e6 if gaussians else None,
                gbs=nbytes / secs / 1e9 if nbytes else None,
                secs=secs,
                times=ts,
                threaded=threaded,
            )
        )
    return rows


def speed_ups(rows: list[dict], top: int) -> list[str]:
    """Each threaded path's ``top``-thread speed-up over its one-thread figure, paired: repeat i's one-thread time over
    repeat i's ``top``-thread time (both timed within repeat i, a few rows apart, so a slow spell of the host mostly
    hits both), the median of those ratios and their range. Rows that run one thread at every count are left out."""
    one = {r["path"]: r for r in rows if r["threads"] == 1 and r["threaded"]}
    lines = []
    for r in rows:
        if r["threads"] == top and r["path"] in one:
            ratios = sorted(a / b for a, b in zip(one[r["path"]]["times"], r["times"]))
            lines.append(
                f"- {r['path']}: {statistics.median(ratios):.2f}x (per repeat {ratios[0]:.2f}x to {ratios[-1]:.2f}x)"
            )
    return lines


def warm_up(device: torch.device) -> dict:
    """Compile the kernels once (not timed with the rates); seconds per kernel, or None where compiling fails."""
    os.environ["DPCDA_NOISE_COMPILE"] = "1"
    out = {}
    sk = noise.subkey(KEY, ("warm",))
    t = time.perf_counter()
    noise_device.stream_halves(sk, 0, 8, device, compiled=True)
    out["chacha20"] = time.perf_counter() - t
    t = time.perf_counter()
    noise_device.rounded_gaussian(torch.zeros(8, dtype=torch.float64, device=device), 0.7, subkey=sk, start=0)
    out["sampler"] = time.perf_counter() - t
    if device.type == "cpu":
        t = time.perf_counter()
        NoiseStream(KEY, "warm", device="cpu").gaussian(np.zeros(8), 0.7)
        out["sampler (host words)"] = time.perf_counter() - t
    return out


def table(rows: list[dict], device: torch.device) -> str:
    lines = [
        "| path | threads | exact Gaussians/s (M) | keystream GB/s | vs numpy standard_normal | vs torch.randn |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    ref_np = {r["threads"]: r["gps"] for r in rows if r["path"].startswith("numpy")}
    ref_t = {r["threads"]: r["gps"] for r in rows if r["path"].startswith("torch.randn")}
    for r in rows:
        gps = f"{r['gps']:.2f}" if r["gps"] else ""
        gbs = f"{r['gbs']:.3f}" if r["gbs"] else ""
        vs_np = f"{r['gps'] / ref_np[r['threads']]:.2f}x" if r["gps"] and r["threads"] in ref_np else ""
        vs_t = f"{r['gps'] / ref_t[r['threads']]:.2f}x" if r["gps"] and r["threads"] in ref_t else ""
        lines.append(f"| {r['path']} | {r['threads']} | {gps} | {gbs} | {vs_np} | {vs_t} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10_000_000, help="Gaussians per timed call")
    ap.add_argument("--repeat", type=int, default=5, help="timed calls per row (the median is reported)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--threads", type=int, nargs="+", default=None, help="CPU thread counts (default: 1 and all)")
    ap.add_argument("--no-compile", action="store_true", help="eager kernels only")
    ap.add_argument(
        "--host-only", action="store_true", help="numpy, torch.randn and the host paths only (no torch path)"
    )
    ap.add_argument("--out", default=None, help="also write the table (markdown) to this file")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    cores = noise.available_cores()
    counts = args.threads or sorted({1, cores})
    compiled_ok = not (args.no_compile or args.host_only)
    compile_secs = {}
    if compiled_ok:
        try:
            compile_secs = warm_up(device)
            compiled_ok = noise_device.backend() == "compiled"
        except Exception as err:  # noqa: BLE001 - report and go on eagerly
            print(f"torch.compile failed ({type(err).__name__}: {err}); eager only")
            compiled_ok = False
    noise.native_kernel()  # built here, not in a timed call
    name = torch.cuda.get_device_name() if device.type == "cuda" else f"CPU, {cores} cores for this process"
    head = (
        f"{name}; torch {torch.__version__}; kernels: {'compiled (torch.compile)' if compiled_ok else 'eager'}"
        + (f"; compile seconds: {', '.join(f'{k} {v:.1f}' for k, v in compile_secs.items())}" if compile_secs else "")
        + f"; host sampler: {noise_native.status()}"
        + f"; {args.n:,} draws per call, median of {args.repeat} (rows timed in turn)"
    )
    before = torch.get_num_threads(), os.environ.get("DPCDA_NOISE_COMPILE")
    load = os.getloadavg()[0]
    try:
        plan = []
        for threads in counts if device.type == "cpu" else [torch.get_num_threads()]:
            plan += plan_rows(args, device, threads, compiled_ok)
        rows = run_rows(plan, args.repeat, device)
    finally:
        torch.set_num_threads(before[0])
        noise.set_threads(None)
        if before[1] is None:
            os.environ.pop("DPCDA_NOISE_COMPILE", None)
        else:
            os.environ["DPCDA_NOISE_COMPILE"] = before[1]
    head += f"; load average {load:.2f} at start, {os.getloadavg()[0]:.2f} at the end"
    text = head + "\n\n" + table(rows, device)
    if device.type == "cpu" and cores > 1 and len(counts) > 1:
        top = max(counts)
        text += f"\n\nSpeed-up, {top} threads over 1 (median of the repeats' paired ratios):\n"
        text += "\n".join(speed_ups(rows, top))
    print(text)
    if args.out:
        cmd = "python -m benchmarks.perf.bench_noise " + " ".join(argv if argv is not None else sys.argv[1:])
        write_text(args.out, f"Generated by `{cmd.strip()}`.\n\n{text}\n")


if __name__ == "__main__":
    main()
