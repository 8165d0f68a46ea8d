"""Where torch work runs: one device policy for mixing and training."""

from __future__ import annotations

import logging
import queue
import threading
from typing import Iterator, Optional, TypeVar

import numpy as np
import torch

log = logging.getLogger(__name__)
T = TypeVar("T")


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
    ``binomial`` run there with the host's output, element for element: ``privacy.noise.device``), else None (the
    host's samplers, on all its cores)."""
    return device if device.type == "cuda" else None


class HostCopy:
    """A tensor's values on their way to ordinary host memory: started where the tensor is made, finished
    (``result``) by whoever needs the array, so a card can go on with the next chunk while the host finishes this one.

    From a card the values go to a page-locked staging buffer without a wait (torch's caching host allocator; an
    event marks the copy's end), then ``result`` waits for that event alone and copies them into ordinary memory:
    the staging buffer is then freed for a later chunk. The allocator keeps freed buffers (each rounded up to a power
    of two) for the life of the process, so the page-locked memory held is the peak of the buffers in flight at
    once: ``depth + 1`` chunks per mixing thread (``ahead``). A copy from the card straight into pageable memory ran
    at about 1.2 GB/s on an H100 host (``bench_mix_gpu --profile``: 88 % of the mixing step). On the CPU the
    tensor's memory is the array."""

    def __init__(self, t: torch.Tensor | np.ndarray):
        self._array, self._staging, self._copied = None, None, None
        if isinstance(t, np.ndarray) or t.device.type == "cpu":
            self._array = t if isinstance(t, np.ndarray) else t.numpy()
            return
        self._staging = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        self._staging.copy_(t, non_blocking=True)
        self._copied = torch.cuda.Event()
        self._copied.record(torch.cuda.current_stream(t.device))

    def result(self) -> np.ndarray:
        if self._array is None:
            self._copied.synchronize()
            self._array = self._staging.numpy().copy()
            self._staging = self._copied = None
        return self._array


def lookahead(device: torch.device, depth: Optional[int] = None) -> int:
    """Chunks a mixer draws ahead of the one its caller holds (``ahead``): ``depth`` where the caller gave one, else
    1 on a card (the card draws the next chunk while the host copies out and finishes this one) and 0 on a CPU
    worker, whose cores already share each chunk's draws (``privacy.noise.set_threads``, torch's threads):
    ``bench_mix_gpu --device cpu --depth 0 1`` timed the same on a 2-core worker."""
    if depth is not None:
        return depth
    return 1 if device.type == "cuda" else 0


def ahead(items: Iterator[T], depth: int) -> Iterator[T]:
    """``items``, made in a thread of their own up to ``depth`` items ahead of the one the caller holds (0: made
    here, one at a time). Order, values and exceptions are ``items``'s own: an exception raised making an item is
    raised here in its place, after the items before it. The caller's item counts as held until it asks for the
    next one, so at most ``depth + 1`` items exist at once. When this generator is closed (``close``, or collected
    after an exception in the caller) the thread stops after the item it is making and closes ``items`` there; an
    exception that raises is raised here, as ``yield from`` would raise it. Unlike ``yield from``, ``throw`` is not
    passed on to ``items``."""
    if depth < 0:
        raise ValueError(f"depth must be at least 0, got {depth}")
    if depth == 0:
        yield from items
        return
    items = iter(items)
    slots, made, stop = threading.Semaphore(depth + 1), queue.SimpleQueue(), threading.Event()
    end, closing = object(), []

    def make():
        try:
            while slots.acquire() and not stop.is_set():
                try:
                    item = next(items)
                except StopIteration:
                    made.put((end, None))
                    return
                made.put((item, None))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, raised there
            made.put((end, exc))
        finally:
            try:
                close = getattr(items, "close", None)
                if stop.is_set() and close is not None:  # the caller left early (``yield from`` closes only then)
                    close()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller, raised there
                closing.append(exc)

    thread = threading.Thread(target=make, name="dpcda-ahead", daemon=True)
    thread.start()
    closed = False  # by the caller: no other exception is on its way out
    try:
        while True:
            item, exc = made.get()
            if item is end:
                if exc is not None:
                    raise exc
                return
            yield item
            slots.release()  # the caller is done with this item
    except GeneratorExit:
        closed = True
        raise
    finally:
        stop.set()
        slots.release()
        if threading.current_thread() is not thread:  # (a collection in the thread itself may close this generator)
            thread.join()
        if closing and closed:
            raise closing[0]
        if closing:
            log.warning("closing the items after an error also raised %r", closing[0])


def card_waits(fn) -> list:
    """The warnings of torch's sync debug mode while ``fn`` runs: each marks a point where the host waited for every
    kernel queued on the card before it (a blocking copy, a read of a value, ``nonzero``); their ``filename`` and
    ``lineno`` say where. A wait for an event (``HostCopy.result``) is not among them: torch does not report it.
    CUDA only."""
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
