"""benchmarks.studies.dpsgd_classifier: the DP-SGD reference classifier on tiny data (8x8 images, a few dozen rows).

Pure unit tests, no Beam: the clipped per-example sum against a naive loop, determinism of the batches and the noise
in the key, the accounting against the target, and no torch random draw inside a training step.
"""

from __future__ import annotations

import csv
from fractions import Fraction

import numpy as np
import pytest
import torch

from benchmarks.studies import dpsgd_classifier as dc
from dpcda.privacy.accounting import ReleaseEvents, account
from dpcda.privacy.events import DpSgdEvent
from dpcda.privacy.noise import NoiseStream, key_from_test_seed, public_key
from dpcda.storage.shards import write_parquet

SHAPE = (1, 8, 8)
K = 3


def _data(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = torch.from_numpy(rng.random((n, 64), dtype=np.float32))
    y = torch.from_numpy(rng.integers(0, K, n).astype(np.int64))
    return x, y


def _model(seed: int = 0):
    return dc.dp_cnn(seed, SHAPE, K)


def _flat(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def test_model_has_no_cross_example_layers():
    model = _model()
    dc.check_per_example(model)
    names = {type(m).__name__ for m in model.modules()}
    assert "GroupNorm" in names and not names & {"BatchNorm2d", "Dropout"}
    from dpcda.evaluation.models import TableOneCNN

    with pytest.raises(ValueError, match="BatchNorm2d"):
        dc.check_per_example(TableOneCNN(SHAPE, K))


def test_same_public_seed_same_weights_and_global_rng_untouched():
    state = torch.random.get_rng_state()
    a, b, c = _flat(_model(3)), _flat(_model(3)), _flat(_model(4))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert torch.equal(torch.random.get_rng_state(), state)


def _norms(model, x, y) -> torch.Tensor:
    out = []
    for i in range(len(y)):
        model.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
        out.append(torch.linalg.vector_norm(torch.cat([p.grad.reshape(-1) for p in model.parameters()])))
    model.zero_grad(set_to_none=True)
    return torch.stack(out)


@pytest.mark.parametrize("where", ["all clipped", "half clipped", "none clipped"])
def test_clipped_sum_equals_naive_loop(where):
    x, y = _data(11)
    model = _model()
    norms = _norms(model, x, y)
    clip = {"all clipped": 1e-3, "half clipped": float(norms.median()), "none clipped": 1e3}[where]
    assert float(norms.min()) > 1e-3 and float(norms.max()) < 1e3
    fast, loss_sum = dc.clipped_grad_sum(model, x, y, clip, micro_batch=4)  # 3 micro-batches, the last short
    naive = dc.naive_clipped_grad_sum(model, x, y, clip)
    assert fast.dtype == torch.float64 and fast.shape == naive.shape
    torch.testing.assert_close(fast, naive, rtol=1e-5, atol=1e-5 * float(naive.abs().max()))
    with torch.no_grad():
        expected_loss = torch.nn.functional.cross_entropy(model(x), y, reduction="sum")
    assert loss_sum == pytest.approx(float(expected_loss), rel=1e-5)


def test_each_clipped_gradient_is_within_the_clip():
    x, y = _data(5)
    model = _model()
    for i in range(len(y)):
        one, _ = dc.clipped_grad_sum(model, x[i : i + 1], y[i : i + 1], 0.01, micro_batch=8)
        assert float(torch.linalg.vector_norm(one)) <= 0.01


def test_a_rows_clipped_gradient_keeps_its_bits_whatever_the_batch():
    # Without the fixed-shape micro-batches the CNN's per-example gradients of the same rows alone in a block of 1 to
    # 3 rows differ in the last bits from those in a full block (measured on 28x28 rows at 128).
    from dpcda.mechanisms.rowwise import RowDependenceError

    x, y = _data(24)
    model = _model()
    try:
        dc.check_micro_batch(model, 8, x.shape[1])
    except RowDependenceError as err:  # the check doing its job: this CPU's kernels (e.g. AMX) move bits by position
        pytest.skip(f"this machine's CNN kernels are position-dependent, and the classifier refuses: {err}")
    full, _ = dc.clipped_grad_sum(model, x, y, 0.05, micro_batch=8)
    for n in (1, 2, 3, 5, 8, 9, 17):
        part, _ = dc.clipped_grad_sum(model, x[:n], y[:n], 0.05, micro_batch=8)
        rest, _ = dc.clipped_grad_sum(model, x[n:], y[n:], 0.05, micro_batch=8)
        # each row's clipped float64 gradient is the same whichever block holds it: the sums of the parts add up to
        # the whole up to the float64 summation order (far below float32's last bit of one gradient)
        torch.testing.assert_close(part + rest, full, rtol=0, atol=1e-15)
    one = [dc.clipped_grad_sum(model, x[i : i + 1], y[i : i + 1], 0.05, micro_batch=8)[0] for i in range(3)]
    three, _ = dc.clipped_grad_sum(model, x[:3], y[:3], 0.05, micro_batch=8)
    torch.testing.assert_close(one[0] + one[1] + one[2], three, rtol=0, atol=1e-15)


def test_the_micro_batch_check_refuses_a_position_dependent_computation(monkeypatch):
    from dpcda.mechanisms.rowwise import RowDependenceError

    # torch.func computes each example on its own in the model's view, so the only way a row can depend on its
    # neighbours is the batched kernels; stand in for such a kernel: each row gets a trace of the rows before it
    def leaky(model):
        return lambda xb, yb: ([xb + 1e-3 * torch.cumsum(xb, 0)], yb.to(torch.float32))

    monkeypatch.setattr(dc, "_per_example", leaky)
    monkeypatch.setattr(dc, "_CHECKED", set())  # this shape passed the real check in another test
    with pytest.raises(RowDependenceError, match="DP-SGD classifier"):
        dc.check_micro_batch(_model(), 8, 64)


def test_empty_batch_gives_zero_sum():
    x, y = _data(3)
    total, loss = dc.clipped_grad_sum(_model(), x[:0], y[:0], 0.1, micro_batch=8)
    assert torch.count_nonzero(total) == 0 and loss == 0.0


def _plan(n: int = 40, epochs: float = 1.0, batch: int = 8, epsilon: float = 5.0):
    params = dc.DpSgdParams(epochs=epochs, batch=batch, lr=0.5, momentum=0.9, clip=0.5, micro_batch=16)
    parameters = sum(p.numel() for p in _model().parameters())
    return dc.plan_dpsgd(n, parameters, params, epsilon, 1e-5), params


def _train(key_seed: int, plan, params, x, y, **kw):
    return dc.train_dpsgd(
        x, y, plan=plan, params=params, key=key_from_test_seed(key_seed), init_seed=0, model=_model(), log=None, **kw
    )


def test_training_is_deterministic_in_the_key_and_uses_its_paths(monkeypatch):
    x, y = _data(40)
    plan, params = _plan()
    assert plan.rate == Fraction(1, 5) and plan.steps == 5
    paths = []

    class Recording(NoiseStream):
        def __init__(self, key, *path):
            if key != public_key("rowwise-check", 0):  # the position check's public rows are not the run's draws
                paths.append(path)
            super().__init__(key, *path)

    monkeypatch.setattr(dc, "NoiseStream", Recording)
    a = _flat(_train(1, plan, params, x, y))
    assert sorted(paths) == sorted([("dpsgd-batch", t) for t in range(5)] + [("dpsgd-noise", t) for t in range(5)])
    b = _flat(_train(1, plan, params, x, y))
    c = _flat(_train(2, plan, params, x, y))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_batches_and_noise_depend_on_the_key():
    rate = Fraction(1, 4)
    k1, k2 = key_from_test_seed(1), key_from_test_seed(2)
    from dpcda.mechanisms.dpsgd import noisy_sum, poisson_batch

    b1 = poisson_batch(NoiseStream(k1, "dpsgd-batch", 0), 1000, rate)
    assert np.array_equal(b1, poisson_batch(NoiseStream(k1, "dpsgd-batch", 0), 1000, rate))
    assert not np.array_equal(b1, poisson_batch(NoiseStream(k2, "dpsgd-batch", 0), 1000, rate))
    assert not np.array_equal(b1, poisson_batch(NoiseStream(k1, "dpsgd-batch", 1), 1000, rate))
    zero = torch.zeros(50, dtype=torch.float64)
    n1 = noisy_sum(zero, 1.0, NoiseStream(k1, "dpsgd-noise", 0))
    assert torch.equal(n1, noisy_sum(zero, 1.0, NoiseStream(k1, "dpsgd-noise", 0)))
    assert not torch.equal(n1, noisy_sum(zero, 1.0, NoiseStream(k2, "dpsgd-noise", 0)))


@pytest.mark.parametrize(
    "epsilon, n, batch, epochs", [(0.5, 1000, 50, 2), (1.0, 60000, 2048, 7), (10.0, 60000, 2048, 7)]
)
def test_accounted_epsilon_at_most_the_target(epsilon, n, batch, epochs):
    params = dc.DpSgdParams(epochs=epochs, batch=batch)
    plan = dc.plan_dpsgd(n, 344330, params, epsilon, 1e-5)
    assert plan.rate == Fraction(batch, n) and plan.steps == -(-epochs * n // batch)
    assert 0.95 * epsilon <= plan.accounted_epsilon <= epsilon
    again = account(
        ReleaseEvents(
            "poisson",
            shared=(DpSgdEvent("dp_sgd", plan.rate, plan.steps, plan.noise_multiplier),),
            per_class=(),
            gaussian_draws=plan.steps * 344330,
        ),
        1e-5,
    )
    assert again.epsilon == pytest.approx(plan.accounted_epsilon) and again.epsilon <= epsilon
    # a little less noise would overshoot: the calibration is tight
    looser = account(
        ReleaseEvents(
            "poisson",
            shared=(DpSgdEvent("dp_sgd", plan.rate, plan.steps, plan.noise_multiplier * 0.98),),
            per_class=(),
        ),
        1e-5,
    )
    assert looser.epsilon > epsilon


def test_no_torch_randomness_during_training(monkeypatch):
    x, y = _data(40)
    plan, params = _plan()
    model = _model()  # weight init (public randomness) happens before the patch

    def refuse(*args, **kwargs):
        raise AssertionError("torch random draw during a DP-SGD step")

    for name in (
        "randn",
        "rand",
        "randint",
        "randperm",
        "normal",
        "bernoulli",
        "multinomial",
        "rand_like",
        "randn_like",
    ):
        monkeypatch.setattr(torch, name, refuse)
    for name in ("normal_", "uniform_", "bernoulli_", "random_", "exponential_"):
        monkeypatch.setattr(torch.Tensor, name, refuse)
    monkeypatch.setattr(torch.nn.functional, "dropout", refuse)
    dc.train_dpsgd(x, y, plan=plan, params=params, key=key_from_test_seed(0), init_seed=0, model=model, log=None)


def test_plan_rows_must_match():
    x, y = _data(30)
    plan, params = _plan(n=40)
    with pytest.raises(ValueError, match="40 rows"):
        _train(0, plan, params, x, y)


def test_params_validated():
    with pytest.raises(ValueError, match="clip"):
        dc.DpSgdParams(clip=0)
    with pytest.raises(ValueError, match="batch"):
        dc.DpSgdParams(batch=0)


def _shards(root, n_train=48, n_test=20):
    rng = np.random.default_rng(0)
    for split, n in (("train", n_train), ("test", n_test)):
        (root / split).mkdir(parents=True)
        write_parquet(
            str(root / split / "part-00000-of-00001.parquet"),
            rng.random((n, 784), dtype=np.float32),
            rng.integers(0, 10, n).astype(np.int64),
        )


@pytest.mark.filterwarnings("ignore")
def test_cli_writes_and_resumes(tmp_path, monkeypatch):
    _shards(tmp_path / "data")
    out = tmp_path / "out"
    argv = ["--data", str(tmp_path / "data"), "--epsilon", "10", "--runs", "2", "--epochs", "1", "--batch", "16"]
    argv += ["--out", str(out), "--threads", "1", "--micro-batch", "16"]
    assert dc.main(argv) == 0
    with open(out / f"{dc.STEM}.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert [int(r["run"]) for r in rows] == [0, 1]
    for r in rows:
        assert float(r["accounted_epsilon"]) <= 10.0
        assert int(r["steps"]) == 3 and float(r["q"]) == pytest.approx(16 / 48)
        assert 0.0 <= float(r["accuracy"]) <= 1.0
    md = (out / f"{dc.STEM}.md").read_text()
    assert "| 10 | 1e-05 |" in md and "--resume" not in md

    def no_training(*args, **kwargs):
        raise AssertionError("--resume retrained a finished run")

    monkeypatch.setattr(dc, "train_dpsgd", no_training)
    assert dc.main([*argv, "--resume"]) == 0
    with open(out / f"{dc.STEM}.csv") as fh:
        assert len(list(csv.DictReader(fh))) == 2
