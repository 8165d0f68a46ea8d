"""The noise threads of a process, and the fork guard: a stream draws only in the process that made it.

No output depends on the thread count: a draw's words sit at fixed stream positions, and each thread reads its own
span of them. A forked child holds a copy of every stream's position; had it drawn, parent and child would have
drawn the same words, so the guard counts forks (``os.register_at_fork``, not pids, which the system may reuse) and
an object made before a fork refuses to draw after it (``check_not_forked``).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

_FORKED = (
    "a NoiseStream made before a fork cannot draw in the child: parent and child would draw the same noise (make the "
    "stream in the process that draws from it)"
)
_THREADS: Optional[int] = None
_POOL: Optional[ThreadPoolExecutor] = None
_POOL_PID = 0
_POOL_LOCK = threading.Lock()
_FORKS = 0  # forks this process descends from since the module was loaded: a stream draws only where it was made


def _after_fork_in_child() -> None:
    """A forked child: streams made before the fork refuse to draw (``_FORKS`` moved on; a pid could be reused), and
    the pool's lock, which another thread may have held at the fork, is new."""
    global _FORKS, _POOL, _POOL_LOCK
    _FORKS += 1
    _POOL, _POOL_LOCK = None, threading.Lock()


def forks() -> int:
    """Forks this process descends from since the noise package was loaded: an object that draws keeps the count at
    its making and passes it to ``check_not_forked`` before every draw."""
    return _FORKS


def check_not_forked(forks: int) -> None:
    """RuntimeError where an object made when ``forks()`` was ``forks`` is used in a process forked since."""
    if forks != _FORKS:
        raise RuntimeError(_FORKED)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def set_threads(n: Optional[int]) -> None:
    """Host threads that draw noise (None: ``available_cores()``). No output depends on it: a draw's words sit at
    fixed stream positions, and each thread reads its own span of them."""
    global _THREADS
    if n is not None and int(n) < 1:
        raise ValueError(f"noise threads must be at least 1, got {n}")
    _THREADS = None if n is None else int(n)


def threads() -> int:
    return _THREADS or available_cores()


def executor(n: int) -> ThreadPoolExecutor:
    """The noise threads of this process (a forked worker starts its own: threads do not survive a fork)."""
    global _POOL, _POOL_PID
    with _POOL_LOCK:
        if _POOL is None or _POOL._max_workers != n or _POOL_PID != os.getpid():
            _POOL, _POOL_PID = ThreadPoolExecutor(max_workers=n, thread_name_prefix="dpcda-noise"), os.getpid()
        return _POOL
