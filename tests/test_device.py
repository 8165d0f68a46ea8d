"""The device policy's pieces that move chunks: ``ahead`` (the next chunk's draws in a thread of their own) and
``HostCopy`` (a chunk's rows on their way to the host). CUDA cases under the ``gpu`` marker."""

from __future__ import annotations

import faulthandler
import gc
import threading
import time
from fractions import Fraction

import numpy as np
import pytest
import torch

from dpcda.mechanisms.device import HostCopy, ahead, lookahead
from dpcda.mechanisms.dpcda import mix_class
from dpcda.mechanisms.dpmix import mix_dataset
from dpcda.privacy.noise import key_from_test_seed
from tests.test_noise_device import _same_bits

KEY = key_from_test_seed(7)


@pytest.fixture(autouse=True)
def _no_hang():
    """A stuck ``ahead`` would hang the suite: past 120 s the process dumps its threads and exits (a failure)."""
    faulthandler.dump_traceback_later(120, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


def _ahead_threads() -> list:
    return [t for t in threading.enumerate() if t.name == "dpcda-ahead"]


def _wait_for(condition, seconds: float = 10.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.002)
    return condition()


def _within(fn, seconds: float = 30.0):
    """``fn()``'s value, or its exception raised here; fails instead of hanging if ``fn`` has not ended within
    ``seconds`` (a stuck ``ahead``)."""
    out = []

    def run():
        try:
            out.append((fn(), None))
        except BaseException as exc:  # noqa: BLE001 - raised again in the test's thread
            out.append((None, exc))

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    assert out, f"no result within {seconds} s"
    value, exc = out[0]
    if exc is not None:
        raise exc
    return value


@pytest.mark.parametrize("depth", [0, 1, 3])
def test_ahead_keeps_the_items_and_their_order(depth):
    assert _within(lambda: list(ahead(iter(range(40)), depth))) == list(range(40))
    assert _within(lambda: list(ahead([], depth))) == []
    assert not _ahead_threads()  # the thread is joined when the items run out


@pytest.mark.parametrize("depth", [1, 2])
def test_ahead_makes_items_in_its_own_thread_exactly_depth_ahead(depth):
    """Items are made in another thread while the caller holds one, never more than ``depth`` beyond it: at depth 0
    (made here) or unbounded the counts below differ."""
    made, makers, n = [], set(), 12

    def items():
        for i in range(n):
            makers.add(threading.get_ident())
            made.append(i)
            yield i

    for held in ahead(items(), depth):
        want = min(held + 1 + depth, n)
        assert _wait_for(lambda: len(made) >= want), (held, len(made), want)
        time.sleep(0.02)  # room to run further ahead, were it allowed to
        assert len(made) == want, (held, len(made), want)
    assert makers and threading.get_ident() not in makers


@pytest.mark.parametrize("error", [ValueError("chunk 3 refused"), SystemExit(3), KeyboardInterrupt()])
def test_ahead_raises_the_makers_exception_after_the_items_before_it(error):
    def items():
        yield from range(3)
        raise error

    got = []

    def consume():
        for i in ahead(items(), 1):
            got.append(i)

    with pytest.raises(type(error)):
        _within(consume)
    assert got == [0, 1, 2]
    assert not _ahead_threads()


def test_an_exception_closing_the_items_reaches_the_caller_as_at_depth_0():
    def items():
        try:
            yield from range(100)
        finally:
            raise OSError("cleanup failed")

    for depth in (0, 1):
        it = ahead(items(), depth)
        assert next(it) == 0
        with pytest.raises(OSError, match="cleanup failed"):
            _within(it.close)
        assert not _ahead_threads()
    with pytest.raises(ValueError, match="at least 0"):
        next(ahead(iter([1]), -1))


@pytest.mark.parametrize("leave", ["close", "raise"])
def test_leaving_early_stops_the_thread_and_closes_the_items_there(leave):
    closed_in, made = [], []

    def items():
        try:
            for i in range(1000):
                made.append(i)
                yield i
        finally:
            closed_in.append(threading.get_ident())

    def consume():
        it = ahead(items(), 2)
        for i in it:
            if i == 4:
                if leave == "close":
                    it.close()
                    return
                raise KeyError("the caller failed")

    if leave == "raise":
        with pytest.raises(KeyError):
            _within(consume)
        gc.collect()  # the traceback held the caller's frame, and with it the generator, until now
    else:
        _within(consume)
    assert not _ahead_threads()  # joined when the generator closed
    assert len(closed_in) == 1 and closed_in[0] != threading.get_ident()
    assert 5 <= len(made) <= 7  # item 4 held, at most two made beyond it


def test_an_interrupted_caller_keeps_its_exception_and_logs_one_from_closing_the_items(caplog, monkeypatch):
    """Ctrl-C while waiting for an item (here the queue's ``get`` raises it once the first item arrives): the
    KeyboardInterrupt is what the caller sees; an error closing ``items`` behind it is logged, not raised in its
    place. Exhausted items are not closed (as ``yield from``)."""
    import queue
    import types

    from dpcda.mechanisms import device

    class Interrupted(queue.SimpleQueue):
        def get(self, *a, **k):
            super().get(*a, **k)
            raise KeyboardInterrupt

    def items():
        try:
            yield 0
            time.sleep(0.3)
            yield 1
        finally:
            raise OSError("cleanup failed")

    monkeypatch.setattr(device, "queue", types.SimpleNamespace(SimpleQueue=Interrupted))
    with caplog.at_level("WARNING", logger="dpcda.mechanisms.device"):
        with pytest.raises(KeyboardInterrupt):
            _within(lambda: list(ahead(items(), 1)))
    assert "cleanup failed" in caplog.text
    assert not _ahead_threads()
    monkeypatch.undo()

    class Items:  # an iterator whose close raises: not called when the items run out
        def __init__(self):
            self.left = 2

        def __iter__(self):
            return self

        def __next__(self):
            if not self.left:
                raise StopIteration
            self.left -= 1
            return self.left

        def close(self):
            raise OSError("closed after the end")

    assert _within(lambda: list(ahead(Items(), 1))) == [1, 0]


def test_host_copy_on_the_cpu_is_the_array_and_the_lookahead_is_the_cards():
    a = np.arange(6.0).reshape(2, 3)
    assert HostCopy(a).result() is a
    t = torch.arange(6.0)
    assert np.shares_memory(HostCopy(t).result(), t.numpy())
    assert lookahead(torch.device("cpu")) == 0 and lookahead(torch.device("cuda", 0)) == 1


@pytest.mark.parametrize("depth", [None, 0, 1])
def test_the_mixers_draw_in_another_thread_when_asked_and_on_a_card(depth, monkeypatch):
    """The depth reaches both mixers: their draws run off the caller's thread at depth 1, and by default where the
    device's lookahead is 1 (a card's, patched in here); on the caller's thread at depth 0 and on a CPU worker."""
    from dpcda.mechanisms import dpcda, dpmix

    drew_in = []
    for module, name in ((dpcda, "start_chunk"), (dpmix, "sample_index_tensors")):
        real = getattr(module, name)
        monkeypatch.setattr(
            module, name, lambda *a, _real=real, **k: drew_in.append(threading.get_ident()) or _real(*a, **k)
        )
    rng = np.random.default_rng(4)
    x, y = rng.normal(size=(200, 6)) * 0.05, rng.integers(0, 3, 200)
    kw = dict(key=KEY, mode="fixed", mixing_order=4, sigma_x=0.3, samples=900, chunk_rows=300, depth=depth)
    for cards_lookahead in (False, True):
        if cards_lookahead:
            for module in (dpcda, dpmix):
                monkeypatch.setattr(module, "lookahead", lambda dev, d=None: lookahead(torch.device("cuda", 0), d))
        drew_in.clear()
        caller = _within(
            lambda: (
                list(mix_class(x, class_index=0, num_classes=3, **kw)),
                list(mix_dataset(x, y, num_classes=3, sigma_y=0.5, **kw)),
                threading.get_ident(),
            )
        )[-1]
        assert len(drew_in) == 6
        off_thread = depth == 1 or (depth is None and cards_lookahead)
        assert all((ident != caller) == off_thread for ident in drew_in), (depth, cards_lookahead, drew_in, caller)


@pytest.mark.parametrize("mode", ["fixed", "poisson"])
def test_mixers_release_the_same_rows_at_any_depth(mode):
    """Drawing chunks ahead changes nothing in the rows, labels or chunk order, also for a retry's chunk list."""
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(400, 10)) * 0.05, rng.integers(0, 3, 400)
    kw = dict(key=KEY, mode=mode, mixing_order=8, sigma_x=0.3, samples=2100, chunk_rows=500)
    kw.update(sampling_rate=Fraction(8, 400), sigma_y=0.5)
    for chunks in (None, [3, 0, 4]):
        runs = {
            depth: _within(
                lambda: (
                    list(mix_class(x, class_index=2, num_classes=3, chunks=chunks, depth=depth, **kw)),
                    list(mix_dataset(x, y, num_classes=3, chunks=chunks, depth=depth, **kw)),
                )
            )
            for depth in (0, 1, 3)
        }
        for depth in (1, 3):
            for got, want in zip(runs[depth], runs[0]):
                assert [c for c, _, _ in got] == [c for c, _, _ in want] == (chunks or [0, 1, 2, 3, 4])
                for (_, f1, l1), (_, f2, l2) in zip(got, want):
                    _same_bits(f1, f2)
                    _same_bits(l1, l2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA")
def test_a_host_copy_from_the_card_starts_without_a_wait_and_gives_the_values():
    """With a second of card work queued before it, the copy is still queued when ``HostCopy`` returns, and
    ``result`` waits for it (an early read would find the staging buffer unwritten)."""
    from dpcda.mechanisms.device import card_waits

    want = np.arange(4096 * 784, dtype=np.float32).reshape(4096, 784)
    t = torch.from_numpy(want).to("cuda")
    torch.cuda.synchronize()
    started = []

    HostCopy(t).result()  # a page-locked buffer of this size in torch's cache: no fresh allocation below

    def start():
        torch.cuda._sleep(2_000_000_000)  # about a second of cycles on the card, queued before the copy
        started.append(HostCopy(t))

    assert card_waits(start) == []  # (card_waits synchronizes first: the sleep is queued inside it)
    assert not started[0]._copied.query()  # HostCopy returned before the copy ran
    _same_bits(started[0].result(), want)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA")
@pytest.mark.parametrize("depth", [0, 1, 2])
def test_mixing_on_the_card_any_depth_releases_the_cpus_rows(depth):
    rng = np.random.default_rng(5)
    x, y = rng.normal(size=(600, 30)) * 0.05, rng.integers(0, 3, 600)
    kw = dict(key=KEY, mode="fixed", mixing_order=8, sigma_x=0.3, samples=5000, chunk_rows=1024, sigma_y=0.5)
    for mix in (
        lambda **k: mix_class(x, class_index=1, num_classes=3, **kw, **k),
        lambda **k: mix_dataset(x, y, num_classes=3, **kw, **k),
    ):
        cpu, card = list(mix(device="cpu")), list(mix(device="cuda", depth=depth))
        assert [c for c, _, _ in card] == [c for c, _, _ in cpu] == [0, 1, 2, 3, 4]
        for (_, f1, l1), (_, f2, l2) in zip(card, cpu):
            _same_bits(f1, f2)
            _same_bits(l1, l2)
