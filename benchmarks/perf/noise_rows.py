"""One row of ``bench_noise`` in a process of its own: it builds the row, makes one untimed call, then times one call
each time it is asked.

    python benchmarks/perf/noise_rows.py ROW THREADS N DEVICE

Run by ``bench_noise`` as a script (not ``-m``), so that the ``dpcda`` it draws with is the one first on
``PYTHONPATH``: this tree's, or another revision's for ``bench_noise --against`` (only the rows in ``PORTABLE`` use
nothing but the API every revision has). It imports only numpy and ``dpcda`` (torch for the rows that use it) and
public names of ``dpcda``.

Protocol (one JSON object per line): after the warm-up call it writes ``{"ready": ..., "warm_s": ..., "info": ...}``
to its standard output; then each line ``time`` on its standard input gets ``{"s": seconds of one call}``, and
``quit`` (or the end of its input) ends it. Anything else the process prints goes to its standard error.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

SIGMA = 0.7
# rows that only use NoiseStream, key_from_test_seed and set_threads (so they also run another revision's dpcda)
PORTABLE = ("host",)


def _spread(fns: list, n: int):
    """A call drawing ``n`` values with the generators' methods ``fns``, one per thread, ceil(n / threads) each (a
    pool made once, as the noise threads are)."""
    per = -(-n // len(fns))
    if len(fns) == 1:
        return lambda: fns[0](per)
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(max_workers=len(fns))
    return lambda: list(pool.map(lambda f: f(per), fns))


def _torch(threads: int):
    import torch

    torch.set_num_threads(threads)
    return torch


def build(row: str, threads: int, n: int, device: str):
    """(call, info) for ``row`` at ``threads`` threads and ``n`` draws (``n`` words of keystream: 3 n)."""
    info: dict = {}
    if row == "numpy":
        return _spread([np.random.default_rng(i).standard_normal for i in range(threads)], n), info
    if row == "legacy":  # np.random.standard_normal is the global RandomState's
        return _spread([np.random.RandomState(i).standard_normal for i in range(threads)], n), info
    if row == "randn":
        torch = _torch(threads)
        dev = torch.device(device)
        if dev.type == "cuda":
            info["device_name"] = torch.cuda.get_device_name(dev)
        return (lambda: torch.randn(n, dtype=torch.float64, device=dev)), info

    import dpcda
    from dpcda.privacy.noise import NoiseStream, key_from_test_seed, set_threads

    info["dpcda"] = os.path.dirname(os.path.abspath(dpcda.__file__))  # which tree's package draws
    key = key_from_test_seed(0)
    set_threads(threads)
    if row == "host":
        center = np.zeros(n)
        call = lambda: NoiseStream(key, "b").gaussian(center, SIGMA)  # noqa: E731
        call()  # the compiled sampler is built and checked at the first large draw: before the status is read
        try:
            from dpcda.privacy.noise.native import status
        except ImportError:  # a revision before the noise package
            from dpcda.privacy.noise_native import status
        info["sampler"] = status()
        return call, info
    if row == "keystream":
        from dpcda.privacy.noise import SLACK_WORDS

        # one buffer for every call: a fresh 24n-byte array per call would time its first-touch page faults too
        # (one thread read 0.64 GB/s that way where this reads 3.3)
        buf = np.empty(3 * n + SLACK_WORDS, np.uint64)
        return (lambda: NoiseStream(key, "w").fill(buf, 3 * n)), info
    if row in ("sampler-compiled", "sampler-numpy"):
        return _sampler_alone(n, key, compiled=row == "sampler-compiled"), info
    torch = _torch(threads)
    from dpcda.privacy.noise import device as noise_device
    from dpcda.privacy.noise import subkey

    dev = torch.device(device)
    sk = subkey(key, ("d",))
    compiled = os.environ.get("DPCDA_NOISE_COMPILE", "1") != "0"
    ct = torch.zeros(n, dtype=torch.float64, device=dev)
    if row == "torch-host-words":
        call = lambda: NoiseStream(key, "b", device="cpu").gaussian(ct, SIGMA)  # noqa: E731
    elif row == "torch-device-words":
        call = lambda: noise_device.rounded_gaussian(ct, SIGMA, subkey=sk, start=0, compiled=compiled)  # noqa: E731
    elif row == "torch-keystream":
        call = lambda: noise_device.stream_halves(sk, 0, 3 * n, dev, compiled=compiled)  # noqa: E731
    else:
        raise SystemExit(f"noise_rows: no row {row!r}")
    call()  # compiles the kernels (timed as the warm-up), so the status below is the timed calls'
    info["backend"] = noise_device.backend(compiled)
    if dev.type == "cuda":
        info["device_name"] = torch.cuda.get_device_name(dev)
    return call, info


def _sampler_alone(n: int, key: bytes, *, compiled: bool):
    """The host's per-block sampler on words already drawn, one thread: the compiled kernel and its finishing
    (``native_sampler.call_kernel``, ``finish_block``), or the numpy sampler (``gaussian.rounded_gaussian``)."""
    from dpcda.privacy.noise import BLOCK, STATS_PER_BLOCK, NoiseStream, grid_for, native_kernel
    from dpcda.privacy.noise.gaussian import rounded_gaussian
    from dpcda.privacy.noise.native_sampler import call_kernel, finish_block

    words = NoiseStream(key, "s").words(3 * BLOCK).reshape(3, BLOCK)
    top = np.ascontiguousarray(words[:2]).reshape(-1)
    center, out, dist, st = np.zeros(BLOCK), np.empty(BLOCK), np.empty(BLOCK), np.empty((1, STATS_PER_BLOCK))
    g = grid_for(SIGMA)
    if not compiled:
        return lambda: [rounded_gaussian(center, SIGMA, g, words) for _ in range(0, n, BLOCK)]
    fn = native_kernel()
    if fn is None:
        from dpcda.privacy.noise.native import status

        raise RuntimeError(f"no compiled sampler: {status()}")

    def run():
        for _ in range(0, n, BLOCK):
            call_kernel(fn, 1, BLOCK, top, 0, 2 * BLOCK, center, out, dist, st, SIGMA, g)
            finish_block(st[0], dist, center, out, top, lambda i: int(words[2, i]), SIGMA, g)

    return run


def main(argv: list) -> None:
    row, threads, n, device = argv[0], int(argv[1]), int(argv[2]), argv[3]
    proto = os.fdopen(os.dup(1), "w")  # the protocol's own stream; whatever else prints goes to standard error
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    sync = lambda: None  # noqa: E731
    if device.startswith("cuda"):
        import torch

        sync = torch.cuda.synchronize

    def timed(call) -> float:
        sync()
        t = time.perf_counter()
        call()
        sync()
        return time.perf_counter() - t

    t = time.perf_counter()
    call, info = build(row, threads, n, device)
    warm = timed(call) + (time.perf_counter() - t)
    proto.write(json.dumps({"ready": row, "warm_s": warm, "info": {**info, "pid": os.getpid()}}) + "\n")
    proto.flush()
    for line in sys.stdin:
        if line.strip() != "time":
            break
        at = time.time()  # when the call started (wall clock: comparable across the rows' processes)
        proto.write(json.dumps({"s": timed(call), "at": at}) + "\n")
        proto.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
