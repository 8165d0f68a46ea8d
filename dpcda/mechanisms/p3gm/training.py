"""DP-SGD of P3GM's VAE (``mechanisms.p3gm``, step 3): per-example gradients by ghost clipping on fixed-shape
blocks, their position check, the noisy steps and the thread count they run at."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
from fractions import Fraction
from typing import Callable, Optional

import numpy as np
import torch

from dpcda.mechanisms import rowwise
from dpcda.mechanisms.dpsgd import clip_factors, noisy_sum, poisson_batch
from dpcda.mechanisms.p3gm.spec import PROGRESS_EVERY, SGD_BLOCK, MogPrior, P3gmSpec
from dpcda.mechanisms.p3gm.vae import (
    _prior_tensors,
    feature_scale,
    init_state,
    label_weight_for,
    latent_scale,
    pca_decoder,
    per_example_loss,
)
from dpcda.privacy.noise import NoiseStream, public_key

log = logging.getLogger("dpcda.mechanisms.p3gm")


def _block_terms(params: dict, x, mu, eps, y, prior_t, label_weight: float):
    """One block's per-row terms: (losses, [float64 layer inputs], [float64 pre-activation gradients], float64
    per-example gradient norms), every one of them a per-row array (first axis the rows). Only the pre-activations'
    gradients are taken (ghost clipping needs no weight gradient), so the weights enter detached."""
    params = {k: v.detach() for k, v in params.items()}
    x = x.detach().requires_grad_(True)  # a graph to differentiate through (the gradient of x itself is never formed)
    loss, layers = per_example_loss(params, x, mu, eps, y, prior_t, label_weight)
    grads = torch.autograd.grad(loss.sum(), [s for _, s in layers])
    acts = [a.detach().to(torch.float64) for a, _ in layers]
    grads = [g.detach().to(torch.float64) for g in grads]
    sq = torch.zeros(len(y), dtype=torch.float64, device=x.device)
    for a, g in zip(acts, grads):
        sq = sq + row_square_sums(g) * (row_square_sums(a) + 1.0)
    return loss.detach(), acts, grads, torch.sqrt(sq)


def row_square_sums(v: torch.Tensor) -> torch.Tensor:
    """float64 (rows,): each row's sum of squares of the float64 (rows, width) ``v``, in one fixed order on any device.

    A reduction kernel (``vecdot``, ``sum``) may add a row's terms in an order that depends on where the row lies in
    memory (vectorised loads aligned or not, split across threads or warps): on an H200 it gave 8 of 64 rows norms
    one ulp apart by position, which the position check refuses. Here only elementwise IEEE float64 operations run,
    each correctly rounded on every device (no reassociation, no fused multiply-add between kernels): the squares
    (exact for float32 inputs), zero-padded to a power-of-two width, then the first half of the columns added to the
    second half until one column is left. The order of a row's additions is fixed by the width alone, so its sum
    has the same bits at any position, in any batch, on any device (pairwise summation: relative error at most
    ceil(log2 width) 2^-53 of the exact sum, as the terms are >= 0)."""
    return rowwise.pairwise_sum(v * v)


def ghost_clipped_sum(params: dict, x, mu, eps, y, prior_t, label_weight: float, clip: float):
    """(float64 flat sum of the per-example gradients clipped to ``clip`` in ``PARAM_NAMES`` order, float64
    per-example gradient norms, float32 per-example losses), by ghost clipping (see the module docstring).

    The batch runs in zero-padded blocks of exactly SGD_BLOCK rows (``mechanisms.rowwise``); padded rows get factor 0,
    so a record's terms have the same bits whatever the batch's size and other records (``check_sgd_block``)."""
    dev = x.device
    n = len(y)
    if n == 0:
        total = torch.zeros(sum(int(p.numel()) for p in params.values()), dtype=torch.float64, device=dev)
        return total, torch.zeros(0, dtype=torch.float64), torch.zeros(0)
    per_block = []
    for start, stop in rowwise.blocks(n, SGD_BLOCK):
        pad = [rowwise.pad_rows(t[start:stop], SGD_BLOCK) for t in (x, mu, eps, y)]
        per_block.append(_block_terms(params, *pad, prior_t, label_weight))
    # every row's terms are final here; what follows is the float64 sum over the batch (the clip margin covers it)
    loss = torch.cat([b[0] for b in per_block])
    acts = [torch.cat([b[1][i] for b in per_block]) for i in range(len(per_block[0][1]))]
    grads = [torch.cat([b[2][i] for b in per_block]) for i in range(len(per_block[0][2]))]
    norms = torch.cat([b[3] for b in per_block])
    factors = clip_factors(norms, clip)  # 0 where a norm is not finite: that example contributes nothing
    factors[n:] = 0.0  # the padding contributes nothing
    keep = factors > 0
    parts = []
    for a, g in zip(acts, grads):
        gf = torch.where(keep[:, None], g, 0.0) * factors[:, None]
        parts += [(gf.T @ torch.where(keep[:, None], a, 0.0)).reshape(-1), gf.sum(dim=0)]
    return torch.cat(parts), norms[:n], loss[:n]


def check_sgd_block(params: dict, dim: int, spec: P3gmSpec, prior_t) -> None:
    """Position invariance of ``_block_terms`` at SGD_BLOCK rows on this device and thread count, with the given
    (public) weights and ``rowwise.TRIALS`` rolled blocks of public random rows; once per shape, device, threads."""
    dev = next(iter(params.values())).device
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else ""
    shapes = tuple((k, tuple(v.shape), str(v.dtype)) for k, v in params.items())
    priors = tuple((tuple(t.shape), str(t.dtype)) for t in prior_t)
    key = (
        dim,
        spec.latent_dim,
        spec.num_classes,
        shapes,
        priors,
        SGD_BLOCK,
        str(dev),
        name,
        torch.get_num_threads(),
        rowwise.fixed_order_for(dev),
    )
    if key in _CHECKED_SGD:
        return
    stream = NoiseStream(public_key("rowwise-check", 0), "p3gm-sgd", dim, spec.latent_dim, spec.num_classes)
    as_t = lambda a, dt=torch.float32: torch.as_tensor(np.ascontiguousarray(a), dtype=dt, device=dev)  # noqa: E731
    u = (stream.uniform(SGD_BLOCK * (dim + 2 * spec.latent_dim)) - 0.5).reshape(SGD_BLOCK, -1) * 2.0
    block = [
        as_t(u[:, :dim] * math.sqrt(3.0)),
        as_t(u[:, dim : dim + spec.latent_dim]),
        as_t(u[:, dim + spec.latent_dim :] * 2.0),
        as_t(stream.uniform_int(spec.num_classes, SGD_BLOCK), torch.int64),
    ]
    trials = rowwise.rolled_trials(block)

    def terms(x, mu, eps, y):
        loss, acts, grads, norms = _block_terms(params, x, mu, eps, y, prior_t, 1.0)
        return [loss, *acts, *grads, norms]

    rowwise.check_position_invariance(terms, trials, what="p3gm DP-SGD")
    _CHECKED_SGD.add(key)


_CHECKED_SGD: set = set()


# ---------------------------------------------------------------- DP-SGD


def train_vae(
    x: np.ndarray,
    y: np.ndarray,
    xhat: np.ndarray,
    prior: MogPrior,
    spec: P3gmSpec,
    key: bytes,
    device,
    *,
    clip: float,
    basis: Optional[np.ndarray] = None,
    progress: Optional[Callable[[int, int, float], None]] = None,
) -> dict:
    """DP-SGD on the VAE (``spec.steps`` steps); returns the float32 weights by ``PARAM_NAMES``.

    ``x`` float64 (N, d) rows clipped to ``clip``, ``y`` int64 labels, ``xhat`` (N, d') the projection / clip;
    ``basis`` the DP-PCA basis when ``spec.decoder_start`` is "pca" (``pca_decoder``).
    ``progress(step, steps, loss)`` every PROGRESS_EVERY steps and at the last; its loss (the batch's mean
    per-example loss) is a diagnostic of private data, NOT DP: log it where the rows themselves may be seen."""
    dev = torch.device(device)
    n, d = x.shape
    start = init_state(d, spec)
    if spec.decoder_start == "pca":
        if basis is None:
            raise ValueError("p3gm: decoder_start 'pca' needs the basis")
        start = pca_decoder(start, np.asarray(basis, np.float64), spec)
    params = {k: torch.tensor(v, device=dev, requires_grad=True) for k, v in start.items()}
    xt = torch.as_tensor(np.asarray(x, np.float64) * feature_scale(d, clip), dtype=torch.float32, device=dev)
    mut = torch.as_tensor(np.asarray(xhat, np.float64) * latent_scale(spec.latent_dim), dtype=torch.float32, device=dev)
    yt = torch.as_tensor(np.asarray(y, np.int64), device=dev)
    prior_t = _prior_tensors(prior, spec.latent_dim, dev)
    label_weight = label_weight_for(spec, d)
    with _torch_threads(sgd_threads(params, d, spec, prior_t)):
        _sgd_steps(params, xt, mut, yt, prior_t, label_weight, spec, key, progress)
    return {k: v.detach().cpu().numpy().astype(np.float32) for k, v in params.items()}


def _sgd_steps(params: dict, xt, mut, yt, prior_t, label_weight: float, spec: P3gmSpec, key: bytes, progress) -> None:
    """``train_vae``'s DP-SGD steps on the device tensors (rows, latent means, labels), updating ``params``."""
    dev, n = xt.device, len(yt)
    order = list(params.values())
    opt = torch.optim.Adam(order, lr=float(spec.lr), fused=True)  # fused: one kernel per tensor (7x faster on CPU)
    divisor = float(spec.expected_batch) if spec.expected_batch is not None else 1.0
    rate = Fraction(spec.sampling_rate)
    for step in range(spec.steps):
        batch = poisson_batch(NoiseStream(key, "p3gm-batch", step), n, rate)
        eps = NoiseStream(key, "p3gm-eps", step).gaussian(np.zeros((len(batch), spec.latent_dim)), 1.0)
        idx = torch.as_tensor(batch, device=dev)
        total, _, loss = ghost_clipped_sum(
            params,
            xt[idx],
            mut[idx],
            torch.as_tensor(eps, dtype=torch.float32, device=dev),
            yt[idx],
            prior_t,
            label_weight,
            float(spec.grad_clip),
        )
        flat = noisy_sum(total, spec.sgd_noise_std, NoiseStream(key, "p3gm-sgd", step)) / divisor
        offset = 0
        for p in order:
            p.grad = flat[offset : offset + p.numel()].view_as(p)
            offset += p.numel()
        opt.step()
        if progress is not None and ((step + 1) % PROGRESS_EVERY == 0 or step + 1 == spec.steps):
            progress(step + 1, spec.steps, float(loss.mean()) if len(loss) else float("nan"))


_THREADS_LOCK = threading.RLock()  # held while a fit sets torch's thread count


def _new_threads_lock() -> None:  # a child forked while a fit held the lock gets a free one
    global _THREADS_LOCK
    _THREADS_LOCK = threading.RLock()


os.register_at_fork(after_in_child=_new_threads_lock)


@contextlib.contextmanager
def _torch_threads(n: int):
    """torch's intra-op thread count set to ``n`` inside, restored after, under a lock. Whether another thread sees
    the count depends on the build and on whether that thread has run torch's parallel kernels yet (measured with
    torch 2.13's OpenMP build: a count set in a worker thread changed what the main thread read in one test and not
    in another), so a fit changes it only under the lock: two fits in one process do not set it under each other's
    checked blocks."""
    with _THREADS_LOCK:
        before = torch.get_num_threads()
        if n != before:
            torch.set_num_threads(n)
        try:
            yield
        finally:
            if torch.get_num_threads() != before:
                torch.set_num_threads(before)


def sgd_threads(params: dict, dim: int, spec: P3gmSpec, prior_t) -> int:
    """The torch thread count the DP-SGD blocks run at: one at which ``check_sgd_block`` passes.

    That is the process's own count, or, on a CPU where the BLAS gives a row other bits at other positions with that
    many threads, the largest power of two below it that passes. Measured: on a 16-core Intel Xeon (torch 2.11),
    16 threads failed the check and 1 and 2 passed. The check still decides: if no count passes, its refusal
    stands."""
    have = torch.get_num_threads()
    on_cpu = next(iter(params.values())).device.type == "cpu"
    below = [1 << k for k in reversed(range(have.bit_length())) if 1 << k < have]  # 16, 8, ..., 1 below 17 to 32
    counts = [have] + (below if on_cpu else [])
    for i, t in enumerate(counts):
        try:
            with _torch_threads(t):
                check_sgd_block(params, dim, spec, prior_t)
        except rowwise.RowDependenceError as err:
            if i + 1 == len(counts):
                raise
            log.warning(
                "p3gm: the position check failed at %d torch threads, checking %d. It said: %s", t, counts[i + 1], err
            )
            continue
        return t
    raise AssertionError("unreachable")
