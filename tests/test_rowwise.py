"""Per-record arithmetic at fixed shapes (mechanisms.rowwise): a record's computed contribution has the same bits
whatever the other records, their number and the record's position, for the DP-PCA projection, DP-EM and DP-SGD.

These are the bits the sensitivity arguments need (docs/privacy.md, "Sensitivity in the bits"): add or remove one
record and every OTHER record's contribution must stay exactly what it was.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dpcda.mechanisms import p3gm, rowwise
from dpcda.mechanisms.dppca import PROJECT_BLOCK, project_rows
from dpcda.pipeline.cli import _KNOWN
from dpcda.privacy.events import CLIP_MARGIN

KEY = bytes(range(32))


def unit_rows(n, d, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    return x * ((1 - CLIP_MARGIN) / np.linalg.norm(x, axis=1, keepdims=True))


def basis(d, k, seed=1):
    q, _ = np.linalg.qr(np.random.default_rng(seed).normal(size=(d, k)))
    return q


# ---------------------------------------------------------------- the check itself


def test_the_check_passes_a_row_wise_function_and_refuses_a_position_dependent_one():
    x = np.random.default_rng(0).normal(size=(64, 5))
    rowwise.check_position_invariance(lambda a: (np.tanh(a) * 3.0,), [[x]], what="rows")
    position = np.arange(64)[:, None] * 2.0**-50  # row p gets p ulps-worth more: bits depend on the position
    with pytest.raises(rowwise.RowDependenceError, match="depends on its position in a block of 64 rows"):
        rowwise.check_position_invariance(lambda a: (a * (1.0 + position),), [[x]], what="rows")
    # a dependence on the neighbours (a running sum) is caught too
    with pytest.raises(rowwise.RowDependenceError):
        rowwise.check_position_invariance(lambda a: (np.cumsum(a, axis=0),), [[x]], what="rows")
    assert "RowDependenceError" in _KNOWN  # the CLI prints it as one line


def test_pad_rows_and_blocks():
    a = np.ones((3, 2), np.float32)
    p = rowwise.pad_rows(a, 5)
    assert p.shape == (5, 2) and p.dtype == np.float32 and (p[3:] == 0).all() and (p[:3] == 1).all()
    t = rowwise.pad_rows(torch.ones(3, dtype=torch.int64), 4)
    assert t.tolist() == [1, 1, 1, 0]
    assert rowwise.blocks(130, 64) == [(0, 64), (64, 128), (128, 130)] and rowwise.blocks(0, 64) == []
    with pytest.raises(ValueError):
        rowwise.pad_rows(a, 2)


def test_wide_linear_is_f_linear_with_its_gradients():
    rng = np.random.default_rng(3)
    for k, n in ((784, 1000), (1000, 10), (10, 1000), (6, 8)):
        x = torch.tensor(rng.normal(size=(64, k)), dtype=torch.float64, requires_grad=True)
        w = torch.tensor(rng.normal(size=(n, k)), dtype=torch.float64, requires_grad=True)
        b = torch.tensor(rng.normal(size=n), dtype=torch.float64, requires_grad=True)
        g = torch.tensor(rng.normal(size=(64, n)), dtype=torch.float64)
        ours = rowwise.linear(x, w, b)
        ref = F.linear(x, w, b)
        torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-12)
        got = torch.autograd.grad(ours, [x, w, b], g)
        want = torch.autograd.grad(ref, [x, w, b], g)
        for a, e in zip(got, want):
            torch.testing.assert_close(a, e, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------- projection


@pytest.mark.parametrize("k", [2, 10, 32])
def test_a_records_projection_has_the_same_bits_in_any_dataset(k):
    x = unit_rows(2 * PROJECT_BLOCK + 300, 50)
    v = basis(50, k)
    full = project_rows(x, v, 1.0)
    for n in (1, 2, 3, 7, 16, PROJECT_BLOCK - 1, PROJECT_BLOCK, PROJECT_BLOCK + 1):
        assert np.array_equal(project_rows(x[:n], v, 1.0), full[:n]), n
    perm = np.random.default_rng(5).permutation(len(x))
    assert np.array_equal(project_rows(x[perm], v, 1.0), full[perm])  # every record moved to another position
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=3, user_api="blas"):  # OpenBLAS at 3 threads split rows by position (measured)
        assert np.array_equal(project_rows(x[perm], v, 1.0), full[perm])
    assert (np.linalg.norm(full, axis=1) <= 1.0 - CLIP_MARGIN).all()


# ---------------------------------------------------------------- DP-EM


def test_em_statistics_add_one_record_exactly():
    """stats(D + r) - stats(D) is exactly stats({r}), and with r at every kind of position (block edges included)."""
    xhat = unit_rows(p3gm.EM_BLOCK_ROWS + 40, 10, seed=2) * 0.9
    prior = p3gm.public_start(3, 10)
    r = xhat[-1:]
    alone = p3gm.em_statistics(r, prior)
    for n in (0, 1, 5, p3gm.EM_BLOCK_ROWS - 1, p3gm.EM_BLOCK_ROWS):
        rest = xhat[:n]
        base = p3gm.em_statistics(rest, prior)
        for where in sorted({0, n // 2, n}):
            with_r = np.concatenate([rest[:where], r, rest[where:]])
            assert np.array_equal(p3gm.em_statistics(with_r, prior) - base, alone), (n, where)


# ---------------------------------------------------------------- DP-SGD


def _network(d, hidden, latent, classes):
    s = p3gm.P3gmSpec(
        em_noise_std=0.0,
        sampling_rate=Fraction(1),
        steps=0,
        noise_multiplier=0.0,
        latent_dim=latent,
        components=3,
        hidden=hidden,
        num_classes=classes,
    )
    params = {k: torch.tensor(v, requires_grad=True) for k, v in p3gm.init_state(d, s).items()}
    prior_t = p3gm._prior_tensors(p3gm.public_start(3, latent), latent, "cpu")
    return s, params, prior_t


@pytest.mark.parametrize("d, hidden, latent, classes", [(784, 1000, 10, 10), (6, 8, 2, 3), (23, 100, 10, 2)])
def test_a_records_gradient_norm_and_loss_have_the_same_bits_in_any_batch(d, hidden, latent, classes):
    s, params, prior_t = _network(d, hidden, latent, classes)
    p3gm.check_sgd_block(params, d, s, prior_t)  # the shapes pass the position check on this machine
    rng = np.random.default_rng(4)
    n = 150
    x = torch.tensor(rng.normal(size=(n, d)), dtype=torch.float32)
    mu = torch.tensor(rng.normal(size=(n, latent)), dtype=torch.float32)
    eps = torch.tensor(rng.normal(size=(n, latent)), dtype=torch.float32)
    y = torch.tensor(rng.integers(0, classes, n))
    _, norms, losses = p3gm.ghost_clipped_sum(params, x, mu, eps, y, prior_t, 3.0, 1.0)
    assert norms.shape == (n,) and losses.shape == (n,)
    for idx in ([0], [5, 0], [149, 3, 0], list(range(64)), list(range(65)), list(range(n))[::-1]):
        i = torch.tensor(idx)
        _, nb, lb = p3gm.ghost_clipped_sum(params, x[i], mu[i], eps[i], y[i], prior_t, 3.0, 1.0)
        assert torch.equal(nb, norms[i]) and torch.equal(lb, losses[i]), idx


def test_adding_a_record_moves_the_clipped_sum_by_its_own_clipped_gradient():
    s, params, prior_t = _network(40, 64, 10, 4)
    rng = np.random.default_rng(6)
    n = 100
    x = torch.tensor(rng.normal(size=(n, 40)), dtype=torch.float32)
    mu = torch.tensor(rng.normal(size=(n, 10)), dtype=torch.float32)
    eps = torch.tensor(rng.normal(size=(n, 10)), dtype=torch.float32)
    y = torch.tensor(rng.integers(0, 4, n))
    clip = 0.5
    without, _, _ = p3gm.ghost_clipped_sum(params, x[1:], mu[1:], eps[1:], y[1:], prior_t, 3.0, clip)
    total, _, _ = p3gm.ghost_clipped_sum(params, x, mu, eps, y, prior_t, 3.0, clip)
    alone, _, _ = p3gm.ghost_clipped_sum(params, x[:1], mu[:1], eps[:1], y[:1], prior_t, 3.0, clip)
    assert float(torch.linalg.vector_norm(alone)) <= clip * (1 - CLIP_MARGIN / 2)
    torch.testing.assert_close(total - without, alone, rtol=0, atol=1e-12)  # float64 summation error only


def _pairwise_reference(row) -> float:
    """The pairwise order of ``row_square_sums`` in plain Python floats (IEEE float64, one rounding per operation)."""
    s = [float(v) * float(v) for v in row]
    while len(s) & (len(s) - 1):
        s.append(0.0)
    while len(s) > 1:
        half = len(s) // 2
        s = [s[i] + s[half + i] for i in range(half)]
    return s[0]


@pytest.mark.parametrize("width", [1, 2, 3, 10, 17, 784, 1000, 1024])
def test_row_square_sums_take_one_fixed_order_whatever_the_rows_place(width):
    """Each row's sum is the pairwise tree of its own squares, bit for bit: alone, in a block, at any position, in a
    tensor whose rows start at odd memory offsets (the alignment a reduction kernel could branch on)."""
    rng = np.random.default_rng(width)
    rows = torch.tensor(rng.normal(size=(64, width)).astype(np.float32), dtype=torch.float64)
    got = p3gm.row_square_sums(rows)
    assert [float(v) for v in got] == [_pairwise_reference(r) for r in rows.tolist()]
    exact = [sum(Fraction(float(v)) ** 2 for v in r) for r in rows.tolist()]  # the exact sums of squares
    bound = max(1, (width - 1).bit_length()) * 2.0**-53 * 1.0001
    assert all(abs(Fraction(float(g)) - e) <= Fraction(bound) * e for g, e in zip(got, exact))
    for perm in (torch.roll(torch.arange(64), 1), torch.roll(torch.arange(64), 33), torch.arange(63, -1, -1)):
        assert torch.equal(p3gm.row_square_sums(rows[perm]), got[perm])
    assert torch.equal(p3gm.row_square_sums(rows[5:6]), got[5:6])
    storage = torch.zeros(64 * width + 3, dtype=torch.float64)
    storage[3:] = rows.reshape(-1)
    assert torch.equal(p3gm.row_square_sums(storage[3:].view(64, width)), got)  # misaligned rows
    assert torch.equal(p3gm.row_square_sums(rows.T.contiguous().T), got)  # column-major layout


def _with_position_dependent_bits(monkeypatch, which: str):
    """``_block_terms`` as on a device where output ``which`` of the rows at positions 3 mod 8 of a block moves."""
    real = p3gm._block_terms

    def moved(*args):
        loss, acts, grads, norms = real(*args)
        at = torch.arange(len(norms)) % 8 == 3
        if which == "norms-ulp":  # one ulp: what a position-dependent float64 reduction gives
            norms = torch.where(at, torch.nextafter(norms, torch.full_like(norms, math.inf)), norms)
        elif which == "f32-bit":  # the lowest bit of a float32 pre-activation gradient
            g = grads[0].to(torch.float32)
            bumped = torch.nextafter(g, torch.full_like(g, math.inf)).to(torch.float64)
            grads = [torch.where(at[:, None], bumped, grads[0])] + grads[1:]
        return loss, acts, grads, norms

    monkeypatch.setattr(p3gm.training, "_block_terms", moved)
    monkeypatch.setattr(p3gm.training, "_CHECKED_SGD", set())


@pytest.mark.parametrize("which", ["norms-ulp", "f32-bit"])
def test_the_sgd_check_refuses_a_single_bit_that_depends_on_the_position(monkeypatch, which):
    """The check stays bitwise for every per-row output, the norms included: one ulp at some positions refuses."""
    s, params, prior_t = _network(23, 100, 10, 2)
    p3gm.check_sgd_block(params, 23, s, prior_t)  # passes as computed
    _with_position_dependent_bits(monkeypatch, which)
    with pytest.raises(rowwise.RowDependenceError, match="depends on its position in a block of 64 rows"):
        p3gm.check_sgd_block(params, 23, s, prior_t)


def test_the_norms_no_longer_use_a_reduction_kernel(monkeypatch):
    """A device whose reduction kernels add a row's terms in a position-dependent order (simulated: ``vecdot``,
    ``sum`` and ``linalg.vector_norm`` move one ulp at positions 3 mod 8) changes no per-row output: they are not
    called for the per-row terms, and the check passes."""
    s, params, prior_t = _network(23, 100, 10, 2)

    def shaky(fn):
        def run(*a, **k):
            out = fn(*a, **k)
            if out.dim() == 1 and out.dtype == torch.float64 and len(out) == p3gm.SGD_BLOCK:
                at = torch.arange(len(out)) % 8 == 3
                out = torch.where(at, torch.nextafter(out, torch.full_like(out, math.inf)), out)
            return out

        return run

    monkeypatch.setattr(torch.linalg, "vecdot", shaky(torch.linalg.vecdot))
    monkeypatch.setattr(torch.linalg, "vector_norm", shaky(torch.linalg.vector_norm))
    monkeypatch.setattr(p3gm.training, "_CHECKED_SGD", set())
    p3gm.check_sgd_block(params, 23, s, prior_t)


def test_a_release_refuses_shapes_that_fail_the_check_before_reading_rows(tmp_path, monkeypatch):
    """The launcher runs the fit's checks on public stand-ins: a failing check is one line, nothing written."""
    from dpcda.pipeline import release
    from dpcda.schemas.config import load_config
    from tests.conftest import make_dataset, write_dataset

    feats, labels = make_dataset(n_per_class=10, num_classes=3, dim=8)
    write_dataset(tmp_path / "in", feats, labels, shards=1)

    def refuse(*a, **k):
        raise rowwise.RowDependenceError("p3gm DP-SGD: refused for the test")

    monkeypatch.setattr(p3gm.mechanism, "check_shapes", refuse)
    cfg = load_config(
        None,
        {
            "input": str(tmp_path / "in" / "*.parquet"),
            "output": str(tmp_path / "out"),
            "epsilon": 4.0,
            "mechanism": "p3gm",
            "num_classes": 3,
            "p3gm_latent_dim": 3,
            "p3gm_hidden": 16,
        },
    )
    with pytest.raises(rowwise.RowDependenceError, match="refused for the test"):
        release.run_release(cfg, ["--runner=DirectRunner", "--direct_running_mode=in_memory"])
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- the fixed-order product (GPU workers)


def test_fixed_order_matmul_is_the_product_within_the_pairwise_bound():
    rng = np.random.default_rng(11)
    for m, k, n in ((64, 784, 32), (64, 1000, 10), (5, 3, 7), (64, 1, 4), (3, 16, 0)):
        a = torch.tensor(rng.normal(size=(m, k)), dtype=torch.float32)
        b = torch.tensor(rng.normal(size=(k, n)), dtype=torch.float32)
        got = rowwise.fixed_order_matmul(a, b).double()
        exact = a.double() @ b.double()  # float32 products are exact in float64; the float64 sum is far closer
        scale = a.double().abs() @ b.double().abs()
        bound = (max(1, (k - 1).bit_length()) + 1) * 2.0**-24 * scale
        assert got.shape == (m, n) and bool(((got - exact).abs() <= bound).all())
    small = torch.tensor(rng.integers(-8, 9, size=(64, 37)), dtype=torch.float32)  # exact sums: the same numbers
    other = torch.tensor(rng.integers(-8, 9, size=(37, 9)), dtype=torch.float32)
    assert torch.equal(rowwise.fixed_order_matmul(small, other), small @ other)


def test_fixed_order_matmul_gives_a_row_the_same_bits_alone_in_any_block_and_in_pieces(monkeypatch):
    """The point of the path: a row's outputs do not depend on which rows share its block, nor where it lies."""
    rng = np.random.default_rng(12)
    a = torch.tensor(rng.normal(size=(64, 784)), dtype=torch.float32)
    b = torch.tensor(rng.normal(size=(784, 40)), dtype=torch.float32)
    whole = rowwise.fixed_order_matmul(a, b)
    for i in (0, 3, 37, 63):
        assert torch.equal(rowwise.fixed_order_matmul(a[i : i + 1], b)[0], whole[i])
    assert torch.equal(rowwise.fixed_order_matmul(torch.roll(a, 5, 0), b), torch.roll(whole, 5, 0))
    monkeypatch.setattr(rowwise, "FIXED_ORDER_PIECE", 64 * 1024 * 3)  # pieces of 3 columns
    assert torch.equal(rowwise.fixed_order_matmul(a, b), whole)


def test_linear_on_the_fixed_order_path_is_f_linear_with_its_gradients(monkeypatch):
    """``linear`` as a GPU runs it (forced here on the CPU), forward and input gradient through the fixed order."""
    monkeypatch.setattr(rowwise, "fixed_order_for", lambda device: True)
    rng = np.random.default_rng(13)
    for k, n in ((784, 32), (10, 1000), (6, 8)):
        x = torch.tensor(rng.normal(size=(64, k)), dtype=torch.float64, requires_grad=True)
        w = torch.tensor(rng.normal(size=(n, k)), dtype=torch.float64, requires_grad=True)
        b = torch.tensor(rng.normal(size=n), dtype=torch.float64, requires_grad=True)
        g = torch.tensor(rng.normal(size=(64, n)), dtype=torch.float64)
        ours, ref = rowwise.linear(x, w, b), F.linear(x, w, b)
        torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-12)
        for a, e in zip(torch.autograd.grad(ours, [x, w, b], g), torch.autograd.grad(ref, [x, w, b], g)):
            torch.testing.assert_close(a, e, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shaky_op", ["matmul", "row sum"])
def test_p3gm_on_the_fixed_order_path_passes_where_the_device_kernels_are_position_dependent(monkeypatch, shaky_op):
    """A device whose matrix product or row sum adds a row's terms in a position-dependent order (simulated: ``@``, or
    ``sum(dim=1)`` of a float32 matrix, moves the rows at positions 3 mod 8 by one float32 ulp, as a split-K kernel's
    tiles or a misaligned vector load can) is refused on the device kernels' path and passes on the fixed-order path,
    whose per-example terms match the kernels' within float32 rounding."""
    s, params, prior_t = _network(23, 100, 10, 2)
    rng = np.random.default_rng(14)
    x = torch.tensor(rng.uniform(-1, 1, (150, 23)), dtype=torch.float32)
    mu = torch.tensor(rng.normal(size=(150, 10)), dtype=torch.float32)
    eps = torch.tensor(rng.normal(size=(150, 10)), dtype=torch.float32)
    y = torch.tensor(rng.integers(0, 2, 150))
    blas = p3gm.ghost_clipped_sum(params, x, mu, eps, y, prior_t, 1.0, 1.0)

    def moved(out):
        if out.dtype != torch.float32 or len(out) % 8:
            return out
        at = (torch.arange(len(out)) % 8 == 3).reshape((-1,) + (1,) * (out.dim() - 1))
        return torch.where(at, torch.nextafter(out, torch.full_like(out, math.inf)), out)

    if shaky_op == "matmul":
        plain = torch.Tensor.__matmul__
        monkeypatch.setattr(torch.Tensor, "__matmul__", lambda a, b: moved(plain(a, b)))
    else:
        plain_sum = torch.Tensor.sum

        def shaky_sum(t, *a, **k):
            out = plain_sum(t, *a, **k)
            return moved(out) if t.dim() == 2 and (a[:1] == (1,) or k.get("dim") == 1) else out

        monkeypatch.setattr(torch.Tensor, "sum", shaky_sum)
    monkeypatch.setattr(p3gm.training, "_CHECKED_SGD", set())
    with pytest.raises(rowwise.RowDependenceError, match="depends on its position"):
        p3gm.check_sgd_block(params, 23, s, prior_t)
    monkeypatch.setattr(rowwise, "fixed_order_for", lambda device: True)
    p3gm.check_sgd_block(params, 23, s, prior_t)
    fixed = p3gm.ghost_clipped_sum(params, x, mu, eps, y, prior_t, 1.0, 1.0)
    for got, want in zip(fixed, blas):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA")
@pytest.mark.parametrize("d, hidden, latent", [(784, 32, 3), (131, 32, 3), (784, 1000, 10)])
def test_p3gm_sgd_block_on_cuda_is_position_invariant_and_its_products_are_the_cpus(d, hidden, latent):
    """On a card: the shapes an H100 refused (784 inputs, 32 units), a width whose rows are not 16-byte aligned (131)
    and the default pass the position check, and the fixed-order product has the CPU's bits (elementwise IEEE
    operations only)."""
    s, params, prior_t = _network(d, hidden, latent, 10)
    cuda = {k: v.detach().cuda() for k, v in params.items()}
    p3gm.check_sgd_block(cuda, d, s, tuple(t.cuda() for t in prior_t))
    rng = np.random.default_rng(15)
    a = torch.tensor(rng.normal(size=(64, d)), dtype=torch.float32)
    w = params["enc1.weight"].detach()
    assert torch.equal(rowwise.fixed_order_matmul(a.cuda(), w.T.cuda()).cpu(), rowwise.fixed_order_matmul(a, w.T))
