"""Per-record float computations at fixed shapes: a record's computed numbers depend on the record alone.

A sensitivity argument (DP-SGD's ``C``, DP-EM's ``sqrt(3)``, the mixer's ``2c/l`` on projected rows) bounds how far
ONE record moves a released sum. In the bits it also needs every other record's computed contribution to stay the
same when that record is added or removed. Row-wise float32/float64 arithmetic on a batch does not promise that:
BLAS picks its kernels by the matrix shape, so ``x @ V`` or a ``Linear`` layer can give a row other last bits when the
batch has 1, 3 or 300 rows (measured: torch ``F.linear`` at 1-3 rows, numpy ``X @ V`` at 1, 3 and 7 rows), and a
ReLU, clamp or quantization can turn such a difference into a larger one.

The fix here: every such computation runs on blocks of a FIXED number of rows (``pad_rows`` with zero rows, the
padding then discarded or given weight 0), so the shapes never depend on the data. What remains is the position of a
row inside its block (which other records share the batch decides it). BLAS kernels are data-oblivious (the sequence
of floating-point operations that produces an output element depends on shapes and positions, never on values), so
``check_position_invariance`` settles it for the shapes, device and thread count at hand: it computes a block of
public random rows, and the same rows shifted by one position (and by half a block plus one), and requires every
row's outputs to agree bit for bit. If position p and p + 1 always run the same operations, all positions do.
Random inputs give different roundings to different operation orders with overwhelming probability, so a pass means
the positions share one order. A failure refuses the fit (``RowDependenceError``) rather than weakening the claim.
Measured on this project's CPU: torch blocks of 32 and 64 rows and numpy blocks of 16 to 4096 rows pass, with 1
and 2 threads.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch

from privacy.errors import DpcdaError


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


def _roll(a, shift: int):
    return torch.roll(a, shift, 0) if isinstance(a, torch.Tensor) else np.roll(a, shift, 0)


def _same_rows(a, b) -> np.ndarray:
    """Per-row bitwise equality of two arrays of equal shape (NaN equals NaN)."""
    if isinstance(a, torch.Tensor):
        a, b = a.detach().cpu().numpy(), b.detach().cpu().numpy()
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    same = a.view(np.uint8).reshape(len(a), -1) == b.view(np.uint8).reshape(len(b), -1)
    return same.all(axis=1)


def check_position_invariance(
    fn: Callable[..., Sequence], inputs: Sequence, *, what: str, shifts: Sequence[int] | None = None
) -> None:
    """Raise ``RowDependenceError`` unless ``fn(*inputs)`` (a block of rows; it returns a sequence of per-row arrays,
    first axis the rows) gives every row the same bits when the block's rows are shifted (``shifts``, default 1 and
    half a block plus one). ``inputs`` are public stand-ins of the block's shape and dtypes."""
    rows = inputs[0].shape[0]
    outs = fn(*inputs)
    for shift in shifts if shifts is not None else sorted({1 % rows, (rows // 2 + 1) % rows}):
        moved = fn(*[_roll(a, shift) for a in inputs])
        for k, (a, b) in enumerate(zip(outs, moved)):
            ok = _same_rows(_roll(a, shift), b)
            if not ok.all():
                raise RowDependenceError(
                    f"{what}: on this device and thread count a record's output {k} depends on its position in a "
                    f"block of {rows} rows ({int((~ok).sum())} rows changed bits when shifted by {shift}); the "
                    "per-record sensitivity would not hold in the bits, so the fit is refused"
                )


MIN_WIDTH = 16  # matmul widths below this are zero-padded up to it (measured: narrower outputs break invariance)


def _widen(a: torch.Tensor, dim: int, width: int) -> torch.Tensor:
    extra = width - a.shape[dim]
    if extra <= 0:
        return a
    return torch.cat([a, a.new_zeros(a.shape[:dim] + (extra,) + a.shape[dim + 1 :])], dim=dim)


class _WideLinear(torch.autograd.Function):
    """``x W^T + b`` whose matmuls (forward and the input gradient) never have a width below MIN_WIDTH: narrow
    input or output widths are zero-padded (exact zeros add nothing) and the padding sliced off. On this project's
    CPU the BLAS gives a row other bits at other positions in its block when an output width is small (10 latent or
    label columns); at 16 and above it does not. ``check_position_invariance`` still decides on every machine."""

    generate_vmap_rule = True  # torch.func's per-sample gradients (the tests' reference) run through it too

    @staticmethod
    def forward(x, weight, bias):
        n, k = weight.shape
        wp = _widen(_widen(weight, 0, MIN_WIDTH), 1, MIN_WIDTH)
        out = _widen(x, 1, MIN_WIDTH) @ wp.T
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
        if ctx.needs_input_grad[0]:
            wp = _widen(_widen(weight, 0, MIN_WIDTH), 1, MIN_WIDTH)
            grad_x = (_widen(grad, 1, MIN_WIDTH) @ wp)[:, :k]
        if ctx.needs_input_grad[1]:
            grad_w = grad.T @ x
        if ctx.needs_input_grad[2]:
            grad_b = grad.sum(dim=0)
        return grad_x, grad_w, grad_b


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for a 2-D block of rows, computed at widths of at least MIN_WIDTH."""
    return _WideLinear.apply(x, weight, bias)
