"""The device's kernels: compiled with ``torch.compile`` where it works, else eager (the same integer and IEEE
arithmetic, so the same words and values), the work per call, and small host arrays sent to a card without a wait.

Where ``torch.compile`` works, the block function and the sampler run as fused kernels (inductor: C++ on the CPU,
Triton on CUDA); otherwise eagerly. ``DPCDA_NOISE_COMPILE=0`` runs them eagerly.
"""

from __future__ import annotations

import logging
import os

import torch

# Work per kernel call: ChaCha20 blocks (CPU: 1 MiB of keystream) and Gaussian elements (a multiple of
# BLOCK). The compiled kernels take any batch size (``_BATCH_ARGS``: one compile, no padding). A card takes far
# larger calls, so that launching them costs the host less time than running them costs the card: a mixing chunk of
# 65,536 rows of 784 is one ChaCha20 call and four sampler calls.
BATCH_BLOCKS = {"cpu": 1 << 14, "cuda": 1 << 24}
BATCH_ELEMS = {"cpu": 1 << 17, "cuda": 1 << 24}


def batch(table: dict, device: torch.device) -> int:
    return table.get(device.type, table["cpu"])


def const(values, dtype, device) -> torch.Tensor:
    """A small host array (key words, the sampler's scalars, a Binomial table) as a tensor on ``device``, copied
    without waiting for it: a blocking copy to a card waits for every kernel queued before it (torch's
    ``copy_``: ``memcpy_and_sync``), so each one stalled the card's queue. From page-locked memory the copy is queued
    like a kernel, and torch's caching host allocator keeps the buffer until it is done."""
    t = torch.as_tensor(values, dtype=dtype)
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


_COMPILE_ENV = "DPCDA_NOISE_COMPILE"  # "0": run eagerly


_KERNELS: dict = {}  # name -> the compiled kernel (or the eager function, where compiling failed)
_FUNCS: dict = {}  # name -> its eager function (``backend`` compares the two)


def compile_enabled() -> bool:
    return os.environ.get(_COMPILE_ENV, "1") != "0"


def kernel(name: str, fn, compiled: bool):
    if not compiled:
        return fn
    if name not in _KERNELS:
        _FUNCS[name] = fn
        try:
            _KERNELS[name] = torch.compile(fn, fullgraph=True)
        except Exception:  # noqa: BLE001 - no compiler: the eager function is the same arithmetic
            _KERNELS[name] = fn
    return _KERNELS[name]


# Per kernel, the arguments whose first dimension is the batch: the one size the compiled kernels leave symbolic, so
# that one compile serves every call without padding. Every other size stays fixed (a block's 8192 elements, its
# rows of words): with every size symbolic the CPU sampler ran slower (benchmarks/results/README.md).
_BATCH_ARGS = {"chacha": (2,), "sampler": (0, 1, 2), "sampler64": (0, 1)}


def run(name: str, fn, compiled: bool, *args):
    k = kernel(name, fn, compiled)
    if k is fn:
        return fn(*args)
    mark = getattr(torch._dynamo, "maybe_mark_dynamic", None)  # without it: one recompile, at the second size
    for i in _BATCH_ARGS[name] if mark is not None else ():
        if args[i].shape[0] > 1:  # sizes 0 and 1 are always specialised
            mark(args[i], 0)  # "maybe": a size tied to another's (the centres' 8192 m) is no error
    try:
        return k(*args)
    except torch.OutOfMemoryError:
        raise  # the card's memory, not the compiler: the eager kernel would need more
    except Exception as err:  # noqa: BLE001 - compilation failed at first call (no C++ compiler, no Triton)
        logging.getLogger(__name__).warning(
            "torch.compile failed for the noise kernel %r (%s: %s); running it eagerly, the same arithmetic",
            name,
            type(err).__name__,
            err,
        )
        _KERNELS[name] = fn
        return fn(*args)


def backend(compiled: bool = True) -> str:
    """'compiled' where torch.compile produced the kernels, else 'eager'."""
    if not (compiled and compile_enabled()):
        return "eager"
    return "compiled" if any(k is not _FUNCS[n] for n, k in _KERNELS.items()) else "eager"
