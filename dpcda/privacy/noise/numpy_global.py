"""numpy's global generator, seeded from a noise stream, for a library that draws only from it (mbi)."""

from __future__ import annotations

import threading

import numpy as np

from dpcda.privacy.noise.stream import NoiseStream

_NUMPY_GLOBAL = threading.Lock()


class NumpyGlobalState:
    """numpy's global generator, seeded from ``stream`` (its first 8 words), for a library that draws only from it
    (mbi's ``synthetic_data``): ``with state:`` swaps it in under a process-wide lock (threads never interleave their
    draws), then keeps where it got to and restores the caller's state, so successive uses continue one sequence."""

    def __init__(self, stream: NoiseStream):
        self._seed = stream.words(8).view(np.uint32)
        self._state = None  # the sequence's state after the last use (None: not yet seeded)

    def __enter__(self):
        _NUMPY_GLOBAL.acquire()
        self._caller = np.random.get_state()
        if self._state is None:
            np.random.seed(self._seed)
        else:
            np.random.set_state(self._state)
        return self

    def __exit__(self, *exc):
        try:
            self._state = np.random.get_state()
            np.random.set_state(self._caller)
        finally:
            _NUMPY_GLOBAL.release()
        return False
