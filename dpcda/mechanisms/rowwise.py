"""Per-record float computations at fixed shapes: a record's computed numbers depend on the record alone.

A sensitivity argument (DP-SGD's ``C``, DP-EM's ``sqrt(3)``, the mixer's ``2c/l`` on projected rows) bounds how far
ONE record moves a released sum. In the bits it also needs every other record's computed contribution to stay the
same when that record is added or removed. Row-wise float32/float64 arithmetic on a batch does not promise that:
BLAS picks its kernels by the matrix shape, so ``x @ V`` or a ``Linear`` layer can give a row other last bits when the
batch has 1, 3 or 300 rows (measured: torch ``F.linear`` at 1-3 rows, numpy ``X @ V`` at 1, 3 and 7 rows), and a
ReLU, clamp or quantization can turn such a difference into a larger one.

The fix here: every such computation runs on blocks of a FIXED number of rows (``pad_rows`` with zero rows, the
padding then discarded or given weight 0), so the shapes never depend on the data; torch matmul widths are padded to
multiples of 8 (``linear``), and numpy's products run on one BLAS thread (``one_blas_thread``: OpenBLAS splits work
by its thread count, and at 3, 5, 6, 7 or 12 threads a row's bits depended on its position). What remains is the
position of a row inside its block (which other records share the batch decides it). BLAS kernels are
data-oblivious (the sequence of floating-point operations that produces an output element depends on shapes and
positions, never on values), so ``check_position_invariance`` tests it for the shapes, device and thread count at
hand: blocks of public random rows, each computed as it is and shifted by one position (and by half a block plus
one), every row's outputs (floats before any quantization) required to agree bit for bit. If position p and p + 1
always run the same operations, all positions do. One random row can miss an order difference that rounds the same
way by chance (likely for a short sum), so each check runs ``TRIALS`` independent blocks; a pass is strong evidence,
not a proof, and a failure refuses the release (``RowDependenceError``) rather than weakening the claim.
Measured on this project's CPU: the default shapes pass with 1 and 2 threads.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch

from dpcda.privacy.errors import DpcdaError


class RowDependenceError(DpcdaError, RuntimeError):
    """A per-record computation whose result depends on the record's position in its fixed-shape block."""


def pad_rows(a, rows: int):
    """``a`` (numpy array or tensor, first axis the rows) with zero rows appended up to ``rows`` rows."""
    n = a.shape[0]
    if n > rows:
        raise ValueError(f"pad_rows: {n} rows do not fit a block of {rows}")
    if n == rows:
        return a
    if isinstance(a, torch.Tensor):
        return torch.cat([a, a.new_zeros((rows - n,) + tuple(a.shape[1:]))])
    return np.concatenate([a, np.zeros((rows - n,) + a.shape[1:], a.dtype)])


def blocks(n: int, block: int):
    """(start, stop) of the fixed-size blocks covering ``n`` rows (the last one is padded by the caller)."""
    return [(s, min(s + block, n)) for s in range(0, n, block)]


def one_blas_thread():
    """Context manager: numpy's BLAS on one thread (threadpoolctl), so its partition of a product never varies."""
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1, user_api="blas")


def _roll(a, shift: int):
    return torch.roll(a, shift, 0) if isinstance(a, torch.Tensor) else np.roll(a, shift, 0)


def _same_rows(a, b) -> np.ndarray:
    """Per-row bitwise equality of two arrays of equal shape (NaN equals NaN)."""
    if isinstance(a, torch.Tensor):
        a, b = a.detach().cpu().numpy(), b.detach().cpu().numpy()
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    same = a.view(np.uint8).reshape(len(a), -1) == b.view(np.uint8).reshape(len(b), -1)
    return same.all(axis=1)


def check_position_invariance(fn: Callable[..., Sequence], trials: Sequence[Sequence], *, what: str) -> None:
    """Raise ``RowDependenceError`` unless, for every block of ``trials`` (each a list of inputs, first axis the rows,
    public stand-ins of the real block's shape and dtypes), ``fn(*block)`` (a sequence of per-row arrays) gives every
    row the same bits when the block's rows are shifted by 1 and by half a block plus one.

    Each trial tests every pair of neighbouring positions with one random row; a position-dependent order that
    only sometimes rounds differently (a short sum, one number per row) can slip past one row, so callers pass many
    blocks (``TRIALS``, e.g. ``rolled_trials``)."""
    for inputs in trials:
        rows = inputs[0].shape[0]
        outs = fn(*inputs)
        for shift in sorted({1 % rows, (rows // 2 + 1) % rows}):
            moved = fn(*[_roll(a, shift) for a in inputs])
            for k, (a, b) in enumerate(zip(outs, moved)):
                ok = _same_rows(_roll(a, shift), b)
                if not ok.all():
                    raise RowDependenceError(
                        f"{what}: on this device and thread count a record's output {k} depends on its position in a "
                        f"block of {rows} rows ({int((~ok).sum())} rows changed bits when shifted by {shift}); the "
                        "per-record sensitivity would not hold in the bits, so the release is refused"
                    )


TRIALS = 16  # public blocks per check


def rolled_trials(inputs: Sequence, trials: int = TRIALS) -> list:
    """``trials`` blocks from one block of public inputs, its rows rolled by 37 t positions in block t: every pair of
    neighbouring positions is then tested with ``trials`` different rows, without drawing new ones."""
    rows = inputs[0].shape[0]
    return [[_roll(a, (37 * t) % rows) for a in inputs] for t in range(trials)]


WIDTH_MULTIPLE = 8  # every matmul width is zero-padded up to a multiple of this (see _WideLinear)


def _widen(a: torch.Tensor, dim: int) -> torch.Tensor:
    extra = -a.shape[dim] % WIDTH_MULTIPLE
    if not extra:
        return a
    return torch.cat([a, a.new_zeros(a.shape[:dim] + (extra,) + a.shape[dim + 1 :])], dim=dim)


class _WideLinear(torch.autograd.Function):
    """``x W^T + b`` whose matmuls (forward and the input gradient) have widths that are multiples of WIDTH_MULTIPLE:
    other widths are zero-padded (exact zeros add nothing) and the padding sliced off. On this project's CPU the BLAS
    gives a row other bits at other positions in its block when a width is small (10 latent or label columns) or,
    from 3 threads on, not a multiple of 4; at multiples of 8 no shape we tried did (1 to 8 threads). A width that
    is already a multiple (784 pixels, 1000 hidden units) is used as it is, without a copy.
    ``check_position_invariance`` still decides on every machine."""

    generate_vmap_rule = True  # torch.func's per-sample gradients (the tests' reference) run through it too

    @staticmethod
    def forward(x, weight, bias):
        n = weight.shape[0]
        if fixed_order_for(x.device):
            return fixed_order_matmul(x, weight.T) + bias
        wp = _widen(_widen(weight, 0), 1)
        out = _widen(x, 1) @ wp.T
        return out[:, :n] + bias

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, weight, _ = inputs
        ctx.save_for_backward(x, weight)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        n, k = weight.shape
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0] and fixed_order_for(grad.device):
            grad_x = fixed_order_matmul(grad, weight)
        elif ctx.needs_input_grad[0]:
            wp = _widen(_widen(weight, 0), 1)
            grad_x = (_widen(grad, 1) @ wp)[:, :k]
        if ctx.needs_input_grad[1]:
            grad_w = grad.T @ x
        if ctx.needs_input_grad[2]:
            grad_b = grad.sum(dim=0)
        return grad_x, grad_w, grad_b


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for a 2-D block of rows, at widths that are multiples of WIDTH_MULTIPLE."""
    return _WideLinear.apply(x, weight, bias)


def fixed_order_for(device) -> bool:
    """Whether ``linear`` takes ``fixed_order_matmul`` (and ``row_sums`` its fixed tree) on ``device`` rather than the
    device's matmul and reduction kernels: everywhere but the CPU. On an H100, p3gm's first layer (784 inputs, 32
    units) gave 6 of 64 rows other bits when the block was shifted by one row; cuBLAS picks kernels by shape, and a
    kernel that splits the sum over k (split-K, stream-K) can give a row's tile its own order of additions (our
    reading, not measured). CUDA's reduction kernel vectorises rows wider than 128 with a per-row alignment shift,
    so a row sum's order can follow the row's address as well. The CPU's BLAS and reductions pass
    ``check_position_invariance`` at the shapes used and keep their speed."""
    return torch.device(device).type != "cpu"


def row_sums(v: torch.Tensor) -> torch.Tensor:
    """Each row's sum of the (rows, width) ``v``: on a ``fixed_order_for`` device in the fixed pairwise tree of
    ``fixed_order_matmul`` (elementwise adds only: a row's sum has the same bits at any position), on the CPU
    ``v.sum(dim=1)``. Differentiable either way."""
    return pairwise_sum(v) if fixed_order_for(v.device) else v.sum(dim=1)


def pairwise_sum(v: torch.Tensor) -> torch.Tensor:
    """``v`` summed over its axis 1 in one order fixed by that axis's length alone, with elementwise adds only: the
    axis zero-padded to a power of two, then its first half added to its second half until one is left (pairwise
    summation). Every element of the result gets the same sequence of correctly rounded additions wherever it lies,
    on any device that does not flush subnormals."""
    width = v.shape[1]
    full = 1 << max(0, (width - 1).bit_length())
    if full != width:
        v = torch.cat([v, v.new_zeros(v.shape[:1] + (full - width,) + v.shape[2:])], dim=1)
    while v.shape[1] > 1:
        half = v.shape[1] // 2
        v = v[:, :half] + v[:, half:]
    return v[:, 0]


FIXED_ORDER_PIECE = 1 << 24  # products held at once by fixed_order_matmul (64 MiB of float32)


def fixed_order_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` ((m, k) by (k, n)), each output the sum of its k products in one order fixed by k alone, made of
    elementwise IEEE operations only (as ``p3gm.row_square_sums``): the products, each correctly rounded, zero-padded
    to a power-of-two count, then the first half added to the second half until one is left. No operation involves
    two rows of ``a``, and an elementwise kernel rounds every element alike wherever it lies, so a row's outputs have
    the same bits at any position of its block, in any batch, on any device that rounds IEEE float32 without
    flushing subnormals (torch's CPU and CUDA kernels; a device that fused a multiply into the next add would break
    it, and torch's eager kernels do not fuse). Each output is within (ceil(log2 k) + 1) units of float32 rounding,
    relative to the sum of the products' magnitudes, of the exact sum. Time and memory are those of forming every
    product (m k n), in pieces of about FIXED_ORDER_PIECE products (at least one column each), about 1.5 pieces held
    at once."""
    m, k = a.shape
    n = b.shape[1]
    full = 1 << max(0, (k - 1).bit_length())
    if full != k:  # zero products: they change no sum's value, and every row gets the same ones
        a = torch.cat([a, a.new_zeros((m, full - k))], dim=1)
        b = torch.cat([b, b.new_zeros((full - k, n))], dim=0)
    cols = max(1, FIXED_ORDER_PIECE // max(1, m * full))
    pieces = []
    for j in range(0, n, cols):
        pieces.append(pairwise_sum(a[:, :, None] * b[None, :, j : j + cols]))  # the products (m, full, piece)
    return torch.cat(pieces, dim=1) if pieces else a.new_zeros((m, n))
