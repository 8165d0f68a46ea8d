"""The mixing step alone, as achieved GB/s of gathered rows against the card's measured bandwidth.

    python -m benchmarks.perf.bench_mix_gpu                 # N_k = T_k = 10^6, l = 64, d = 784 on CUDA
    python -m benchmarks.perf.bench_mix_gpu --n 20000 --t 20000 --l 16   # a small CPU run
    python -m benchmarks.perf.bench_mix_gpu --n 200000 --t 200000 --profile 4   # then where 4 chunks spend time
    python -m benchmarks.perf.bench_mix_gpu --n 200000 --t 200000 --waits        # then where a chunk waits (CUDA)
    python -m benchmarks.perf.bench_mix_gpu --n 200000 --t 200000 --depth 0 1    # drawn one chunk ahead, or not

Gathered bytes = T_k * l * d * 8 (each selected record read once per synthetic row, float64). The ceiling is a
device-to-device copy measured on the same card (bytes read + written). The indices and the noise are drawn where a
release draws them (``mechanisms.device.stream_device``: on a CUDA worker both on the card, ``privacy.noise.device``;
on a CPU worker on the host's cores). The index and noise columns time the same chunks' draws alone (same streams,
same shapes) and give their shares of the mixing time. The chunks are a release's mixing step
(``mechanisms.dpcda.mixed_features``), each finished into ordinary host memory; the release's labels,
post-processing and writing are not timed. ``depth`` is how many chunks the draws run ahead of the one being finished
(``mechanisms.device.ahead``; a release takes ``device.lookahead``: 1 on a card, 0 on a CPU worker). Beam-free.
"""

from __future__ import annotations

import argparse
import time

import torch

from dpcda.mechanisms.device import card_waits, lookahead, pick_device, stream_device
from dpcda.mechanisms.dpcda import mixed_features, sample_rows
from dpcda.privacy.noise import NoiseStream, key_from_test_seed


def copy_bandwidth(device, nbytes=2 << 30) -> float:
    a = torch.empty(nbytes // 4, dtype=torch.float32, device=device).normal_()
    b = torch.empty_like(a)
    for _ in range(2):
        b.copy_(a)
    sync(device)
    t = time.perf_counter()
    reps = 5
    for _ in range(reps):
        b.copy_(a)
    sync(device)
    return 2 * nbytes * reps / (time.perf_counter() - t) / 1e9


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def noise_time(key, args, chunk: int, device) -> float:
    """Seconds the mixing noise alone takes for T_k rows in chunks of ``chunk``: the same streams and shapes as
    ``mix_chunk`` draws (a tensor on CUDA, an array on the host)."""
    means = torch.zeros((chunk, args.d), dtype=torch.float64, device=device)
    host = means.cpu().numpy()
    sync(device)
    t = time.perf_counter()
    done, c = 0, 0
    while done < args.t:
        rows = min(chunk, args.t - done)
        stream = NoiseStream(key, "mix-noise", 0, c)
        stream.gaussian(means[:rows] if device.type == "cuda" else host[:rows], 0.1)
        done, c = done + rows, c + 1
    sync(device)
    return time.perf_counter() - t


def index_time(key, args, chunk: int, device) -> float:
    """Seconds the index draws alone take for T_k rows in chunks of ``chunk`` (the streams ``mix_chunk`` gets)."""
    sync(device)
    t = time.perf_counter()
    done, c = 0, 0
    while done < args.t:
        rows = min(chunk, args.t - done)
        stream = NoiseStream(key, "mix-index", 0, c, device=stream_device(device))
        sample_rows(args.n, mode="fixed", mixing_order=args.l, rows=rows, stream=stream)
        done, c = done + rows, c + 1
    sync(device)
    return time.perf_counter() - t


def finish_chunks(x, key, args, chunk: int, depth: int, *, class_index: int, samples: int) -> None:
    """``samples`` rows of class ``class_index`` in chunks of ``chunk``, a release's mixing step (``mixed_features``:
    streams (mix-index/noise, class_index, c)), ``depth`` chunks drawn ahead. Class 0 is timed, 1 warms up, 2 is
    profiled and 3 counts waits."""
    for _ in mixed_features(
        x,
        key=key,
        class_index=class_index,
        mode="fixed",
        mixing_order=args.l,
        sigma_x=0.1,
        samples=samples,
        chunk_rows=chunk,
        dtype=args.dtype,
        depth=depth,
    ):
        pass


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10**6)
    ap.add_argument("--t", type=int, default=10**6)
    ap.add_argument("--l", type=int, default=64)
    ap.add_argument("--d", type=int, default=784)
    ap.add_argument("--chunk-rows", type=int, nargs="+", default=[4096, 16384, 65536])
    ap.add_argument("--device", default="auto")
    ap.add_argument(
        "--depth",
        type=int,
        nargs="+",
        default=None,
        help="chunks drawn ahead of the one being finished, one timed row each (default: the release's, "
        "device.lookahead)",
    )
    ap.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "float64"],
        help="the rows as returned to the host (a release without a DP-PCA basis writes float32)",
    )
    ap.add_argument(
        "--profile", type=int, default=0, metavar="CHUNKS", help="then profile this many chunks of the last size"
    )
    ap.add_argument(
        "--waits",
        action="store_true",
        help="then list where one chunk of the last size waits for the card (torch's sync debug mode; CUDA only)",
    )
    args = ap.parse_args(argv)
    device = pick_device(args.device)
    x = torch.rand((args.n, args.d), dtype=torch.float64, device=device)
    key = key_from_test_seed(0)
    bw = copy_bandwidth(device, nbytes=min(2 << 30, x.numel() * 4))
    gathered = args.t * args.l * args.d * 8
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(
        f"device {name}; N_k={args.n} T_k={args.t} l={args.l} d={args.d}; rows returned as {args.dtype}; "
        f"gathered {gathered / 1e9:.1f} GB; "
        f"copy bandwidth {bw:.0f} GB/s"
    )
    print(
        "| chunk_rows | depth | seconds | gathered GB/s | fraction of copy bandwidth | rows/s | index seconds "
        "| index share | noise seconds | noise share |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    depths = args.depth or [lookahead(device)]
    for chunk in args.chunk_rows:
        # warm-up at full size and the deepest depth: compiled kernels, cached page-locked buffers (class 1's streams)
        finish_chunks(x, key, args, chunk, max(depths), class_index=1, samples=min(args.t, chunk * (max(depths) + 2)))
        timed = []
        for depth in depths:
            sync(device)
            t = time.perf_counter()
            finish_chunks(x, key, args, chunk, depth, class_index=0, samples=args.t)
            sync(device)
            timed.append((depth, time.perf_counter() - t))
        index_secs = index_time(key, args, chunk, device)
        noise_secs = noise_time(key, args, chunk, device)
        for depth, secs in timed:
            print(
                f"| {chunk} | {depth} | {secs:.3f} | {gathered / secs / 1e9:.1f} | {gathered / secs / 1e9 / bw:.2f} | "
                f"{args.t / secs:,.0f} | {index_secs:.3f} | {index_secs / secs:.0%} | {noise_secs:.3f} | "
                f"{noise_secs / secs:.0%} |"
            )
    if args.profile:
        profile(x, key, args, args.chunk_rows[-1], device)
    if args.waits:
        if device.type == "cuda":
            waits(x, key, args, args.chunk_rows[-1], device)
        else:
            print("\n--waits: a CPU worker does not wait for a card (CUDA only)")


def waits(x, key, args, chunk: int, device) -> None:
    """Each line of code where one chunk made the host wait for the card (``device.card_waits``): while the host
    waits the card's queue runs dry."""
    import collections
    import os

    where = collections.Counter(
        f"{os.path.relpath(w.filename)}:{w.lineno}"
        for w in card_waits(lambda: finish_chunks(x, key, args, chunk, 0, class_index=3, samples=chunk))
    )
    print(
        f"\none chunk of {chunk} rows waited for the card {sum(where.values())} times (not counting the wait for "
        "its copy out, an event torch does not report):"
    )
    print("| where | waits |\n|---|---:|")
    for line, count in where.most_common():
        print(f"| {line} | {count} |")


def profile(x, key, args, chunk: int, device) -> None:
    """torch.profiler's table of ``args.profile`` chunks: where the mixing step's time goes, op by op."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with torch_profile(activities=acts) as prof:
        finish_chunks(x, key, args, chunk, 0, class_index=2, samples=chunk * args.profile)  # in this thread
        sync(device)
    for by in (["self_cuda_time_total"] if device.type == "cuda" else []) + ["self_cpu_time_total"]:
        print(f"\n{args.profile} chunks of {chunk} rows, by {by}:")
        print(prof.key_averages().table(sort_by=by, row_limit=25, max_name_column_width=60))


if __name__ == "__main__":
    main()
