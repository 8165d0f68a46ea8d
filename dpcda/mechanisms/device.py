"""Where torch work runs: one device policy for mixing and training."""

from __future__ import annotations

import logging

import numpy as np
import torch

log = logging.getLogger(__name__)


def pick_device(preference: str = "auto") -> torch.device:
    """CUDA when present and asked for ('auto', 'cuda', 'cuda:N'), else the CPU, with a warning if CUDA was named."""
    if preference == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(preference)
    if dev.type == "cuda" and not torch.cuda.is_available():
        log.warning("device=%s asked for but CUDA is not available; using the CPU", preference)
        return torch.device("cpu")
    return dev


def stream_device(device: torch.device):
    """The device a mixing chunk's index stream draws on: the card on a CUDA worker (``NoiseStream.distinct`` and
    ``binomial`` run there with the host's output, element for element: ``privacy.noise_device``), else None (the
    host's samplers, on all its cores)."""
    return device if device.type == "cuda" else None


def to_host(t: torch.Tensor) -> np.ndarray:
    """A tensor's values as a numpy array in ordinary host memory. From a card they pass through a page-locked
    staging buffer (torch's caching host allocator: freed when this returns, so the next chunk reuses it and the
    page-locked memory held stays about one chunk per thread), then one host copy. A copy from the card straight into
    pageable memory ran at about 1.2 GB/s on an H100 host (``bench_mix_gpu --profile``: 88 % of the mixing step)."""
    if t.device.type == "cpu":
        return t.numpy()
    staging = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    staging.copy_(t)
    return staging.numpy().copy()


def card_waits(fn) -> list:
    """The warnings of torch's sync debug mode while ``fn`` runs: each marks a point where the host waited for every
    kernel queued on the card before it (a blocking copy, a read of a value, ``nonzero``); their ``filename`` and
    ``lineno`` say where. CUDA only."""
    import warnings

    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return [w for w in caught if "synchroniz" in str(w.message)]
