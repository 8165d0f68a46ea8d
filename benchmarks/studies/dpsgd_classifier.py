"""A DP-SGD classifier trained on the real Fashion-MNIST training rows: the reference a synthetic release has to beat.

    python -m benchmarks.studies.dpsgd_classifier --epsilon 1 10 --delta 1e-5 --runs 3 [--resume]  # into results/

For each target epsilon and run it trains the evaluation model with DP-SGD on the 60,000 training rows and scores it
on the 10,000 test rows (the test rows are only ever used for that final score). A synthetic release at the same
(epsilon, delta) is worth publishing for classification only if a model trained on it beats this.

Privacy: add or remove one training record (features and label), the ``poisson`` relation of the release job. Every
step's batch is Poisson-sampled with an exact rate q = B / N (B the public expected batch size); per-example
gradients are clipped to L2 norm C and summed, and N(0, (z C)^2) is added to every coordinate
(``mechanisms.dpsgd``). ``privacy.events.DpSgdEvent`` is the event, ``privacy.calibration.calibrate_noise`` finds
the smallest z for the target, ``privacy.accounting.account`` reports the epsilon spent (PLD, RDP cross-check), the
sampler's finite precision included through its Gaussian draw count. The model, the optimiser, the learning rate and
the weight initialisation are public; the model after its last step is released (no selection on any data).

Randomness touching private data comes from ``privacy.noise.NoiseStream`` under ``key_from_test_seed(seed)`` (a
benchmark: fixed, reproducible keys): the batch of step t from path ("dpsgd-batch", t), its noise from
("dpsgd-noise", t). The model has no dropout (it would need masks from the stream), and no other random draw happens
in a step (the tests make ``torch.randn`` and friends raise). The weight initialisation is public randomness: the
global torch generator seeded with the run's public seed, restored afterwards.

The model is seed 000's Table 1 CNN (``evaluation.models.TableOneCNN``, with ``evaluation.train.RowScale`` in front
as the evaluation uses it) with two changes DP-SGD forces:
- its BatchNorm layers mix the examples of a batch, so per-example gradients are not defined: each becomes
  ``GroupNorm(min(32, C), C)``, the replacement Opacus' ``ModuleValidator.fix`` makes (32 and 64 channels: 32 groups);
- dropout is off (p = 0).

Per-example gradients: ``torch.func`` (``functional_call`` + ``vmap`` + ``grad``) in float32, on zero-padded
micro-batches of exactly ``micro_batch`` rows (``mechanisms.rowwise``: the same rows alone in a block of 1 to 3 got
other last bits than in a block of 128, so a record's gradient could depend on the batch's size), padded rows given
clip factor 0; ``check_micro_batch`` refuses to train if a row's gradient depends on its position in the block
(public random rows, once per shape and thread count); their norms in float64, ``mechanisms.dpsgd.clip_factors``, and
the clipped sum in float64 (each gradient cast to float64 before it is scaled and summed). The noisy sum is divided
by the expected batch size B (public, so the update's sensitivity stays C / B) and SGD with momentum takes the step
(post-processing).

Hyper-parameters. Start: Tramer and Boneh (2021, "Differentially Private Learning Needs Better Features"; the
end-to-end CNN for Fashion-MNIST in their repository ftramer/Handcrafted-DP): SGD with momentum 0.9, clip C = 0.1,
lr 4 on (noisy sum) / B, expected batch B = 2048, 40 epochs. 40 epochs do not fit this project's 2-core CPU (about
700 per-example gradients a second: 85 s an epoch), so ``DEFAULTS`` trains 7 (about 10 minutes a run). With so few
epochs the batch and lr were checked on a validation split (``--validation 0.1``: 54,000 training rows, 6,000
held-out TRAINING rows; the test rows never read), at epsilon 1, 2 epochs, one seed, B in {1024, 2048} x lr in
{2, 4}: B = 1024, lr 4 was best (0.857 against 0.834, 0.818, 0.787; ``dpsgd_classifier_fashion_mnist_validation.md``),
so B = 1024 (more steps for the short budget). Those tuning runs touched the training rows and are not accounted in
the reported epsilon, as usual for a benchmark's hyper-parameter choice (Papernot and Steinke 2022 price it).

Writes ``OUT/dpsgd_classifier_fashion_mnist.csv`` (one row per (epsilon, run), appended after each run) and ``.md``
(mean +- std per epsilon and the command). ``--resume`` keeps the rows already there and skips them.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import functools
import glob
import math
import os
import sys
import time
from fractions import Fraction
from typing import Callable, Optional

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from benchmarks.files import RESULTS, write_csv, write_text
from dpcda.evaluation.models import TableOneCNN
from dpcda.evaluation.train import RowScale, stratified_split
from dpcda.mechanisms import rowwise
from dpcda.mechanisms.dpsgd import clip_factors, noisy_sum, poisson_batch
from dpcda.privacy.accounting import ReleaseEvents, account, accountant_delta
from dpcda.privacy.calibration import calibrate_noise
from dpcda.privacy.events import MAX_ROW_RECORDS, DpSgdEvent
from dpcda.privacy.noise import NoiseStream, key_from_test_seed, public_key
from dpcda.storage.shards import read_parquet

STEM = "dpsgd_classifier_fashion_mnist"
DATA = "data/fashion-mnist"
VALIDATION_SEED = 0  # public: which training rows --validation holds out
INPUT_SHAPE = (1, 28, 28)
NUM_CLASSES = 10
FIELDS = (
    "epsilon",
    "delta",
    "accounted_epsilon",
    "noise_multiplier",
    "q",
    "steps",
    "epochs",
    "run",
    "accuracy",
    "seconds",
    "seed",
    "batch",
    "lr",
    "momentum",
    "clip",
    "train_rows",
    "threads",
    "command",
)
# Resume key: a row counts as done only under the same protocol.
KEY_FIELDS = ("epsilon", "delta", "run", "seed", "epochs", "batch", "lr", "momentum", "clip", "train_rows")


@dataclasses.dataclass(frozen=True)
class DpSgdParams:
    """Public training hyper-parameters: Tramer and Boneh 2021's Fashion-MNIST CNN recipe, epochs fitted to the CPU and
    the batch checked on a validation split (module doc)."""

    epochs: float = 7.0  # ~10 min a run on the 2-core CPU (module doc)
    batch: int = 1024  # expected batch size B; q = B / N
    lr: float = 4.0
    momentum: float = 0.9
    clip: float = 0.1
    micro_batch: int = 128  # per-example gradients computed this many at a time (a fixed, padded shape)

    def __post_init__(self):
        if not (self.epochs > 0 and math.isfinite(self.epochs)):
            raise ValueError(f"epochs must be positive, got {self.epochs}")
        if not 1 <= self.batch <= MAX_ROW_RECORDS // 2:
            # CLIP_MARGIN covers the float64 sum of up to MAX_ROW_RECORDS = 2^15 clipped gradients; with B <= 2^14 a
            # Poisson batch holds more with probability below e^(-2^14 / 3) (Chernoff)
            raise ValueError(f"batch must be in [1, {MAX_ROW_RECORDS // 2}], got {self.batch}")
        if not self.lr > 0:
            raise ValueError(f"lr must be positive, got {self.lr}")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum}")
        if not (self.clip > 0 and math.isfinite(self.clip)):
            raise ValueError(f"clip must be positive and finite, got {self.clip}")
        if self.micro_batch < 1:
            raise ValueError(f"micro_batch must be >= 1, got {self.micro_batch}")


DEFAULTS = DpSgdParams()


# ---------------------------------------------------------------- model


def dp_cnn(init_seed: int, input_shape=INPUT_SHAPE, num_classes: int = NUM_CLASSES) -> nn.Module:
    """RowScale + the Table 1 CNN with GroupNorm(min(32, C), C) for BatchNorm and no dropout (see the module doc).

    The weights are drawn from the global torch generator seeded with the PUBLIC ``init_seed``; its state is restored
    afterwards, so nothing else sees the seeding."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(init_seed))
        net = TableOneCNN(input_shape, num_classes, dropout=0.0)
        for i, layer in enumerate(net.features):
            if isinstance(layer, nn.BatchNorm2d):
                c = layer.num_features
                net.features[i] = nn.GroupNorm(min(32, c), c)
        for i, layer in enumerate(net.classifier):
            if isinstance(layer, nn.Dropout):
                net.classifier[i] = nn.Identity()
    return nn.Sequential(RowScale(), net)


def check_per_example(model: nn.Module) -> None:
    """Refuse layers whose output for one example depends on the others (or that draw random numbers)."""
    for name, m in model.named_modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) or (isinstance(m, nn.Dropout) and m.p > 0):
            raise ValueError(f"{name}: {type(m).__name__} has no per-example gradient or draws its own randomness")


# ---------------------------------------------------------------- one step

_COLUMNS = 4096  # per-example gradient columns cast to float64 at a time


def _per_example(model: nn.Module):
    """f(xb, yb) -> ([per-example float32 gradients, (b, numel) per parameter], float32 losses (b,)) by torch.func."""
    params = {k: v.detach() for k, v in model.named_parameters()}
    buffers = {k: v.detach() for k, v in model.named_buffers()}

    def loss_one(p, b, xi, yi):
        logits = functional_call(model, (p, b), (xi.unsqueeze(0),))
        loss = nn.functional.cross_entropy(logits, yi.unsqueeze(0))
        return loss, loss

    per_example = vmap(grad(loss_one, has_aux=True), in_dims=(None, None, 0, 0))

    def terms(xb, yb):
        grads, losses = per_example(params, buffers, xb, yb)
        return [grads[k].reshape(len(yb), -1) for k in params], losses

    return terms


def clipped_grad_sum(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, clip: float, micro_batch: int
) -> tuple[torch.Tensor, float]:
    """(float64 flat sum over the rows of their per-example gradients clipped to ``clip``, summed float64 loss).

    Per-example gradients by ``torch.func`` in float32 on zero-padded micro-batches of exactly ``micro_batch`` rows
    (``mechanisms.rowwise``: a row's gradient has the same bits whatever the batch's size; measured, the same rows
    alone in a block of 1 to 3 got other last bits than in a block of 128), padded rows given clip factor 0; norms,
    clip factors and the sum in float64. The flat order is ``model.named_parameters()``'s."""
    terms = _per_example(model)
    total = sum(p.numel() for p in model.parameters())
    out = torch.zeros(total, dtype=torch.float64)
    loss_sum = 0.0
    for start, stop in rowwise.blocks(len(y), micro_batch):
        n = stop - start
        flat, losses = terms(rowwise.pad_rows(x[start:stop], micro_batch), rowwise.pad_rows(y[start:stop], micro_batch))
        # Column chunks keep each float64 copy small enough for the cache (3x faster than one big cast here).
        sq = torch.zeros(micro_batch, dtype=torch.float64)
        for g in flat:
            for j in range(0, g.shape[1], _COLUMNS):
                c = g[:, j : j + _COLUMNS].to(torch.float64)
                sq += torch.linalg.vecdot(c, c)
        factors = clip_factors(torch.sqrt(sq), clip)  # float64 (b,); 0 where a norm is not finite
        factors[n:] = 0.0  # the padding contributes nothing
        keep = (factors > 0)[:, None]
        offset = 0
        for g in flat:
            for j in range(0, g.shape[1], _COLUMNS):
                c = torch.where(keep, g[:, j : j + _COLUMNS].to(torch.float64), 0.0)  # 0 * inf would be NaN
                out[offset + j : offset + j + c.shape[1]] += factors @ c
            offset += g.shape[1]
        loss_sum += float(losses[:n].detach().to(torch.float64).sum())
    return out, loss_sum


def check_micro_batch(model: nn.Module, micro_batch: int, dim: int) -> None:
    """``mechanisms.rowwise.check_position_invariance`` for the per-example gradients and losses of ``model`` on rows
    of ``dim`` features at ``micro_batch`` rows on this thread count (public random rows and labels; once per shape
    and thread count): raises ``RowDependenceError`` if a row's terms depend on its position in the block."""
    shapes = tuple((k, tuple(v.shape), str(v.dtype)) for k, v in model.named_parameters())
    num_classes = [m for m in model.modules() if isinstance(m, nn.Linear)][-1].out_features
    key = (shapes, micro_batch, dim, torch.get_num_threads())
    if key in _CHECKED:
        return
    stream = NoiseStream(public_key("rowwise-check", 0), "dpsgd-classifier", micro_batch, dim)
    block = [
        torch.as_tensor(stream.uniform(micro_batch * dim).reshape(micro_batch, dim), dtype=torch.float32),
        torch.as_tensor(stream.uniform_int(num_classes, micro_batch), dtype=torch.int64),
    ]
    terms = _per_example(model)

    def fn(xb, yb):
        flat, losses = terms(xb, yb)
        return [*flat, losses]

    rowwise.check_position_invariance(fn, rowwise.rolled_trials(block), what="DP-SGD classifier")
    _CHECKED.add(key)


_CHECKED: set = set()


def naive_clipped_grad_sum(model: nn.Module, x: torch.Tensor, y: torch.Tensor, clip: float) -> torch.Tensor:
    """The same sum, one example at a time through autograd (the tests' reference)."""
    params = [p for _, p in model.named_parameters()]
    out = torch.zeros(sum(p.numel() for p in params), dtype=torch.float64)
    for i in range(len(y)):
        model.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
        g = torch.cat([p.grad.reshape(-1).to(torch.float64) for p in params])
        out += g * clip_factors(torch.linalg.vector_norm(g).reshape(1), clip)[0]
    model.zero_grad(set_to_none=True)
    return out


# ---------------------------------------------------------------- privacy plan


@dataclasses.dataclass(frozen=True)
class DpSgdPlan:
    rows: int
    rate: Fraction
    steps: int
    noise_multiplier: float
    event: DpSgdEvent
    parameters: int
    accounted_epsilon: float
    delta: float

    @property
    def gaussian_draws(self) -> int:
        return self.steps * self.parameters


def plan_dpsgd(rows: int, parameters: int, params: DpSgdParams, epsilon: float, delta: float) -> DpSgdPlan:
    """q = min(B, N) / N exactly, steps = ceil(epochs / q), z calibrated to (epsilon, delta), and the accounting."""
    rate = Fraction(min(params.batch, rows), rows)
    steps = max(1, math.ceil(Fraction(params.epochs) / rate))  # exact: no float rounding at whole epochs

    def events(z):
        return [DpSgdEvent("dp_sgd", rate, steps, z)]

    z = calibrate_noise("poisson", events, target_epsilon=epsilon, delta=accountant_delta(delta))
    (event,) = events(z)
    acc = account(ReleaseEvents("poisson", shared=(event,), per_class=(), gaussian_draws=steps * parameters), delta)
    if acc.epsilon > epsilon:
        raise AssertionError(f"calibration overshot: {acc.epsilon} > {epsilon}")  # never expected
    return DpSgdPlan(rows, rate, steps, z, event, parameters, acc.epsilon, delta)


# ---------------------------------------------------------------- training


def train_dpsgd(
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    plan: DpSgdPlan,
    params: DpSgdParams,
    key: bytes,
    init_seed: int,
    model: Optional[nn.Module] = None,
    log: Optional[Callable[[str], None]] = functools.partial(print, flush=True),
    log_every: int = 100,
) -> nn.Module:
    """DP-SGD on (x float32 (N, d), y int64 (N,)) for ``plan.steps`` steps; returns the model after the last step.

    ``model``: the initial model (default ``dp_cnn(init_seed)``); it is trained in place."""
    n = len(y)
    if n != plan.rows:
        raise ValueError(f"plan for {plan.rows} rows, got {n}")
    model = dp_cnn(init_seed) if model is None else model
    check_per_example(model)
    check_micro_batch(model, params.micro_batch, x.shape[1])
    model.train()
    sizes = [p.numel() for _, p in model.named_parameters()]
    if sum(sizes) != plan.parameters:
        raise ValueError(f"plan for {plan.parameters} parameters, model has {sum(sizes)}")
    opt = torch.optim.SGD(model.parameters(), lr=params.lr, momentum=params.momentum)
    expected = float(plan.rate * n)  # public: B
    std = plan.noise_multiplier * params.clip
    t0 = time.time()
    loss_acc, rows_acc = 0.0, 0
    for step in range(plan.steps):
        idx = torch.from_numpy(poisson_batch(NoiseStream(key, "dpsgd-batch", step), n, plan.rate))
        total, loss_sum = clipped_grad_sum(model, x[idx], y[idx], params.clip, params.micro_batch)
        noisy = noisy_sum(total, std, NoiseStream(key, "dpsgd-noise", step)) / expected
        for p, g in zip(model.parameters(), torch.split(noisy, sizes)):
            p.grad = g.reshape(p.shape).to(p.dtype)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss_acc += loss_sum
        rows_acc += len(idx)
        if log is not None and ((step + 1) % log_every == 0 or step + 1 == plan.steps):
            # Diagnostic only (the batch loss is not a DP output): never written to the results.
            elapsed = time.time() - t0
            log(
                f"  step {step + 1}/{plan.steps}  loss {loss_acc / max(rows_acc, 1):.4f}  "
                f"{elapsed:.0f}s elapsed, {elapsed / (step + 1) * (plan.steps - step - 1):.0f}s to go"
            )
            loss_acc, rows_acc = 0.0, 0
    return model


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int = 1000) -> float:
    model.eval()
    right = 0
    for i in range(0, len(y), batch):
        right += int((model(x[i : i + batch]).argmax(dim=1) == y[i : i + batch]).sum())
    return right / max(len(y), 1)


# ---------------------------------------------------------------- data and files


def load_split(data: str, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(float32 (N, 784), int64 (N,)) from ``data/split/*.parquet`` in shard order."""
    paths = sorted(glob.glob(os.path.join(data, split, "*.parquet")))
    if not paths:
        raise SystemExit(f"{os.path.join(data, split)}: no Parquet shards (dpcda prepare writes them)")
    blocks = [b for p in paths for b in read_parquet(p, "features", "label")]
    x = np.concatenate([b.features for b in blocks]).astype(np.float32, copy=False)
    y = np.concatenate([b.labels for b in blocks]).astype(np.int64, copy=False)
    return torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(y)


def _key(row: dict) -> tuple:
    return tuple(float(row[k]) for k in KEY_FIELDS)


def read_rows(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path) as fh:
        return list(csv.DictReader(fh))


def write_rows(path: str, rows: list[dict]) -> None:
    write_csv(path, FIELDS, rows)


GROUP_FIELDS = ("epsilon", "delta", "epochs", "batch", "lr", "momentum", "clip", "train_rows")


def write_md(path: str, rows: list[dict], scored: str = "test") -> None:
    """Mean +- std per (epsilon, protocol), and the commands that produced the rows."""
    groups: dict = {}
    for r in rows:
        groups.setdefault(tuple(float(r[k]) for k in GROUP_FIELDS), []).append(r)
    commands = list(dict.fromkeys(r["command"] for r in rows))
    lines = [
        "Generated by " + "; then ".join(f"`{c}`" for c in commands) + ".",
        "",
        (
            "A DP-SGD classifier trained on the real Fashion-MNIST training rows, scored on the 10,000 test rows: "
            "the reference a synthetic release at the same (epsilon, delta) has to beat. "
            if scored == "test"
            else "VALIDATION (hyper-parameter choice): DP-SGD on the training rows minus a stratified hold-out, "
            "scored on that hold-out (the test rows are not read). "
        )
        + "Add/remove-one DP-SGD with "
        "Poisson sampling (``mechanisms.dpsgd``, noise and batches from ``privacy.noise.NoiseStream``), accounted "
        "by ``privacy.accounting`` (PLD). Model: seed 000's Table 1 CNN with GroupNorm(min(32, C), C) for BatchNorm "
        "and no dropout; SGD with momentum; the model after the last step is scored. Each run is its own noise key "
        "and weight initialisation (the CSV's seed column). std: sample std (ddof 1) over runs. 2-core CPU; the "
        "seconds depend on the torch threads and on whatever else ran (about 600 s a run with 2 threads on an idle "
        "machine).",
        "",
        "| epsilon | delta | accounted eps | z | q | steps | epochs | batch | lr | momentum | clip | train rows | runs "
        "| accuracy mean +- std | each | s per run | threads |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|---|",
    ]
    for _, rs in sorted(groups.items(), key=lambda kv: kv[0]):
        accs = np.array([float(r["accuracy"]) for r in rs])
        std = f"{np.std(accs, ddof=1):.4f}" if len(accs) > 1 else "-"
        r0 = rs[0]
        lines.append(
            f"| {float(r0['epsilon']):g} | {float(r0['delta']):g} | "
            f"{max(float(r['accounted_epsilon']) for r in rs):.4f} | {float(r0['noise_multiplier']):.4f} | "
            f"{float(r0['q']):.5f} | {r0['steps']} | {float(r0['epochs']):g} | {r0['batch']} | {float(r0['lr']):g} | "
            f"{float(r0['momentum']):g} | {float(r0['clip']):g} | {r0['train_rows']} | {len(rs)} | "
            f"{accs.mean():.4f} +- {std} | {' '.join(f'{a:.4f}' for a in accs)} | "
            f"{np.mean([float(r['seconds']) for r in rs]):.0f} | "
            f"{' '.join(dict.fromkeys(str(r['threads']) for r in rs))} |"
        )
    write_text(path, "\n".join(lines) + "\n")


# ---------------------------------------------------------------- CLI


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.studies.dpsgd_classifier", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--epsilon", type=float, nargs="+", default=[1.0, 10.0])
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0, help="run r uses seed + r (noise key and weight init)")
    ap.add_argument("--out", default=RESULTS)
    ap.add_argument("--data", default=DATA, help="folder with train/ and test/ Parquet shards")
    ap.add_argument("--resume", action="store_true", help="keep the CSV's rows and skip the runs they hold")
    ap.add_argument("--epochs", type=float, default=DEFAULTS.epochs)
    ap.add_argument("--batch", type=int, default=DEFAULTS.batch, help="expected batch size (q = batch / N)")
    ap.add_argument("--lr", type=float, default=DEFAULTS.lr)
    ap.add_argument("--momentum", type=float, default=DEFAULTS.momentum)
    ap.add_argument("--clip", type=float, default=DEFAULTS.clip)
    ap.add_argument("--micro-batch", type=int, default=DEFAULTS.micro_batch)
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    ap.add_argument("--limit", type=int, default=None, help="first N training rows only (smoke tests)")
    ap.add_argument(
        "--validation",
        type=float,
        default=0.0,
        help="hold out this stratified fraction of the TRAINING rows, train on the rest and score on it instead of "
        "the test rows (for choosing hyper-parameters; writes OUT/" + STEM + "_validation.*)",
    )
    ap.add_argument("--log-every", type=int, default=100)
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs must be >= 1")
    try:
        params = DpSgdParams(args.epochs, args.batch, args.lr, args.momentum, args.clip, args.micro_batch)
    except ValueError as err:
        ap.error(str(err))
    torch.set_num_threads(args.threads)
    os.makedirs(args.out, exist_ok=True)
    if not 0.0 <= args.validation < 1.0:
        ap.error("--validation must be in [0, 1)")
    stem = STEM + ("_validation" if args.validation else "")
    csv_path, md_path = (os.path.join(args.out, f"{stem}.{ext}") for ext in ("csv", "md"))
    command = "python -m benchmarks.studies.dpsgd_classifier " + " ".join(sys.argv[1:] if argv is None else argv)
    rows = read_rows(csv_path) if args.resume else []
    done = {_key(r) for r in rows}

    x, y = load_split(args.data, "train")
    if args.limit:
        x, y = x[: args.limit], y[: args.limit]
    if args.validation:  # the test rows stay unread: score on a held-out slice of the training rows
        fit, held = stratified_split(y.numpy(), args.validation, VALIDATION_SEED)
        x, y, tx, ty = x[fit], y[fit], x[held], y[held]
    else:
        tx, ty = load_split(args.data, "test")
    parameters = sum(p.numel() for p in dp_cnn(0).parameters())
    scored = "validation" if args.validation else "test"
    print(
        f"{len(y)} training rows, {len(ty)} {scored} rows, {parameters} parameters, {args.threads} threads", flush=True
    )
    plans: dict = {}
    for run in range(args.runs):  # run-major: an interrupted job still has every epsilon's first runs
        for eps in args.epsilon:
            row_key = dict(
                epsilon=eps,
                delta=args.delta,
                run=run,
                seed=args.seed + run,
                epochs=params.epochs,
                batch=params.batch,
                lr=params.lr,
                momentum=params.momentum,
                clip=params.clip,
                train_rows=len(y),
            )
            if _key(row_key) in done:
                print(f"epsilon {eps} run {run}: in {csv_path}, skipped", flush=True)
                continue
            plan = plans.get(eps)
            if plan is None:
                plan = plans[eps] = plan_dpsgd(len(y), parameters, params, eps, args.delta)
                print(
                    f"epsilon {eps}: q = {plan.rate} ({float(plan.rate):.5f}), {plan.steps} steps, "
                    f"z = {plan.noise_multiplier:.4f}, accounted epsilon {plan.accounted_epsilon:.4f}",
                    flush=True,
                )
            seed = row_key["seed"]
            t0 = time.time()
            model = train_dpsgd(
                x,
                y,
                plan=plan,
                params=params,
                key=key_from_test_seed(seed),
                init_seed=seed,
                log_every=args.log_every,
            )
            acc = accuracy(model, tx, ty)
            seconds = time.time() - t0
            print(f"epsilon {eps} run {run}: {scored} accuracy {acc:.4f} ({seconds:.0f}s)", flush=True)
            rows.append(
                {
                    **row_key,
                    "accounted_epsilon": f"{plan.accounted_epsilon:.6f}",
                    "noise_multiplier": f"{plan.noise_multiplier:.6f}",
                    "q": f"{float(plan.rate):.8f}",
                    "steps": plan.steps,
                    "accuracy": f"{acc:.4f}",
                    "seconds": f"{seconds:.1f}",
                    "threads": args.threads,
                    "command": command,
                }
            )
            write_rows(csv_path, rows)
            write_md(md_path, rows, scored)
    print(f"wrote {csv_path} and {md_path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
