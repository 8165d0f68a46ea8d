"""The mixing step alone, as achieved GB/s of gathered rows against the card's measured bandwidth.

    python -m benchmarks.bench_mix_gpu                 # N_k = T_k = 10^6, l = 64, d = 784 on CUDA
    python -m benchmarks.bench_mix_gpu --n 20000 --t 20000 --l 16   # a small CPU run

Gathered bytes = T_k * l * d * 8 (each selected record read once per synthetic row, float64). The ceiling is a
device-to-device copy measured on the same card (bytes read + written). Indices and noise come from the CPU
(``privacy.noise``), as in a release; the table also says how much of the time that takes. Beam-free.
"""

from __future__ import annotations

import argparse
import time

import torch

from dpcda.mechanisms.device import pick_device
from dpcda.mechanisms.dpcda import mix_chunk
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


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10**6)
    ap.add_argument("--t", type=int, default=10**6)
    ap.add_argument("--l", type=int, default=64)
    ap.add_argument("--d", type=int, default=784)
    ap.add_argument("--chunk-rows", type=int, nargs="+", default=[4096, 16384, 65536])
    ap.add_argument("--device", default="auto")
    args = ap.parse_args(argv)
    device = pick_device(args.device)
    x = torch.rand((args.n, args.d), dtype=torch.float64, device=device)
    key = key_from_test_seed(0)
    bw = copy_bandwidth(device, nbytes=min(2 << 30, x.numel() * 4))
    gathered = args.t * args.l * args.d * 8
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(
        f"device {name}; N_k={args.n} T_k={args.t} l={args.l} d={args.d}; gathered {gathered / 1e9:.1f} GB; "
        f"copy bandwidth {bw:.0f} GB/s"
    )
    print("| chunk_rows | seconds | gathered GB/s | fraction of copy bandwidth | rows/s |")
    print("|---:|---:|---:|---:|---:|")
    for chunk in args.chunk_rows:
        mix_chunk(
            x,
            mode="fixed",
            mixing_order=args.l,
            sigma_x=0.1,
            rows=min(chunk, 1024),  # warm-up
            index_stream=NoiseStream(key, "warmup-index"),
            noise_stream=NoiseStream(key, "warmup-noise"),
        )
        sync(device)
        t = time.perf_counter()
        done, c = 0, 0
        while done < args.t:
            rows = min(chunk, args.t - done)
            mix_chunk(
                x,
                mode="fixed",
                mixing_order=args.l,
                sigma_x=0.1,
                rows=rows,
                index_stream=NoiseStream(key, "mix-index", 0, c),
                noise_stream=NoiseStream(key, "mix-noise", 0, c),
            )
            done, c = done + rows, c + 1
        sync(device)
        secs = time.perf_counter() - t
        print(
            f"| {chunk} | {secs:.3f} | {gathered / secs / 1e9:.1f} | {gathered / secs / 1e9 / bw:.2f} | "
            f"{args.t / secs:,.0f} |"
        )


if __name__ == "__main__":
    main()
