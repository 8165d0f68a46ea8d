"""The training loop: one run of the network on synthetic rows (``train_one``: Adam with warm-up and cosine decay,
gradient clipping, an EMA of the weights, the synthetic hold-out scored every epoch) and batched prediction.
Data stay resident on the device as tensors; batches are index slices of one permutation per epoch. Why the
schedule looks the way it does: docs/evaluation.md.
"""

from __future__ import annotations

import copy
import math
from typing import Optional

import numpy as np
import torch
from torch import nn

from dpcda.evaluation.models import RowScale, TableOneCNN, make_model
from dpcda.evaluation.recipes import Recipe, use_bf16
from dpcda.evaluation.stacking import ProbeStart, Stacked, logit_scale, stack_weights
from dpcda.evaluation.targets import target_loss


@torch.no_grad()
def predict_logits(model: nn.Module, x: torch.Tensor, batch: int, autocast: bool) -> torch.Tensor:
    """The model's outputs (float32) on ``x``, ``batch`` rows at a time, in eval mode."""
    model.eval()
    out = []
    for i in range(0, len(x), batch):
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=autocast):
            out.append(model(x[i : i + batch]).float())
    return torch.cat(out) if out else torch.empty(0, device=x.device)


def predict(model: nn.Module, x: torch.Tensor, batch: int, autocast: bool) -> torch.Tensor:
    """The predicted class of each row of ``x`` (the argmax of ``predict_logits``)."""
    if not len(x):
        return torch.empty(0, dtype=torch.long, device=x.device)
    return predict_logits(model, x, batch, autocast).argmax(dim=1)


class _EMA:
    """Exponential moving average of parameters and float buffers (BN running stats) in a shadow model."""

    def __init__(self, model: nn.Module, decay: float):
        self.decay = decay
        self.shadow = copy.deepcopy(model).eval()
        for p in self.shadow.parameters():
            p.requires_grad_(False)
        self.steps = 0
        src, dst = model.state_dict(), self.shadow.state_dict()  # tensors sharing storage with the modules
        self._float = [(dst[k], src[k]) for k in dst if dst[k].dtype.is_floating_point]
        self._other = [(dst[k], src[k]) for k in dst if not dst[k].dtype.is_floating_point]

    @torch.no_grad()
    def update(self) -> None:
        self.steps += 1
        d = min(self.decay, (1 + self.steps) / (10 + self.steps))  # short warm-up: early weights forgotten fast
        torch._foreach_lerp_([a for a, _ in self._float], [b for _, b in self._float], 1.0 - d)
        for a, b in self._other:
            a.copy_(b)


def effective_batch_size(rows: int, batch_size: int, min_steps: int = 32, floor: int = 16) -> int:
    """``batch_size``, made smaller on small data so an epoch still has about ``min_steps`` steps."""
    return max(1, min(batch_size, max(floor, rows // min_steps)))


def _lr_factor(step: int, total: int, recipe: Recipe) -> float:
    warm = max(1, int(recipe.warmup_fraction * total))
    if step < warm:
        return (step + 1) / warm
    if recipe.schedule == "constant":
        return 1.0
    return 0.5 * (1.0 + math.cos(math.pi * (step - warm) / max(1, total - warm)))


def train_one(
    train_x: torch.Tensor,
    train_y: torch.Tensor,
    val_x: torch.Tensor,
    val_y: torch.Tensor,
    *,
    num_classes: int,
    input_shape,
    epochs: int,
    seed: int,
    recipe: Recipe,
    device: torch.device,
    progress=None,
    test_x: Optional[torch.Tensor] = None,
    test_y: Optional[torch.Tensor] = None,
    train_soft: Optional[torch.Tensor] = None,
    val_soft: Optional[torch.Tensor] = None,
    model_kind: Optional[str] = None,
    start: Optional[tuple[np.ndarray, np.ndarray]] = None,
):
    """One training run; returns (model to score, curves dict). ``test_*`` only feed an informational curve.

    ``train_soft`` / ``val_soft`` (rows, K): released label scores, fitted with ``recipe.soft_loss`` instead of
    ``train_y`` and scored on the hold-out with the same loss (``val_score``). ``start``: (W, b), the linear map the
    model starts from when ``recipe.probe_start`` (``ProbeStart``), fitted to the targets as ``train_soft`` holds
    them (else to one-hot labels, and put on the cross-entropy's scale by ``logit_scale``)."""
    torch.manual_seed(seed)
    gen = torch.Generator(device=device).manual_seed(seed)
    net = make_model(input_shape, num_classes, kind=model_kind, dropout=recipe.dropout, norm=recipe.norm)
    model = nn.Sequential(RowScale(), net) if recipe.row_scale else net
    if recipe.probe_start:
        if start is None:
            raise ValueError("recipe.probe_start needs the probe's fit (start=(W, b))")
        model = ProbeStart(model, *start)
        if train_soft is None:
            z = model.linear(train_x.cpu())
            model.scale.data.fill_(logit_scale(z, train_y.cpu(), recipe.label_smoothing))
    model = model.to(device)
    if isinstance(net, TableOneCNN) and recipe.channels_last:
        model = model.to(memory_format=torch.channels_last)
    autocast = use_bf16(recipe, device)
    opt = torch.optim.Adam(
        model.parameters(),
        lr=recipe.lr,
        weight_decay=recipe.weight_decay,
        fused=device.type == "cuda" or None,
        foreach=None if device.type == "cuda" else True,
    )
    n = len(train_y)
    batch_size = effective_batch_size(n, recipe.batch_size)
    steps_per_epoch = max(1, math.ceil(n / batch_size))
    total = steps_per_epoch * epochs
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: _lr_factor(s, total, recipe))
    loss_fn = nn.CrossEntropyLoss(label_smoothing=recipe.label_smoothing)
    soft_kind = recipe.soft_loss
    ema = _EMA(model, recipe.ema_decay) if recipe.ema_decay else None
    curves = {"train_loss": [], "val_accuracy": [], "val_score": [], "lr": []}
    if test_x is not None:
        curves["test_accuracy"] = []
    best, best_state, best_epoch = math.inf, None, epochs - 1
    if len(val_y) and recipe.selection == "val_score" and recipe.probe_start:  # the start itself is a candidate
        scored = ema.shadow if ema is not None else model
        best = _val_score(scored, val_x, val_y, val_soft, recipe, autocast)
        best_state, best_epoch = {k: v.detach().clone() for k, v in scored.state_dict().items()}, -1
    curves["start_val_score"] = best if best_epoch == -1 else float("nan")
    weights = z_val = None
    if recipe.stack:
        if start is None:
            raise ValueError("recipe.stack needs the probe's fit (start=(W, b))")
        w0, b0 = (torch.as_tensor(np.asarray(v, np.float32), device=device) for v in start)
        z_val = val_x.reshape(len(val_x), -1).float() @ w0 + b0
        curves["stack_weights"] = []
        if len(val_y) and recipe.selection == "val_score":  # the probe alone is a candidate
            weights, best = stack_weights(z_val, None, val_y, val_soft)
            best_epoch = -1
            curves["start_val_score"] = best
    for epoch in range(epochs):
        model.train()
        perm = torch.randperm(n, device=device, generator=gen)
        total_loss = torch.zeros((), device=device)
        for i in range(steps_per_epoch):
            idx = perm[i * batch_size : (i + 1) * batch_size]
            if len(idx) < 2 and n >= 2:  # BatchNorm needs two rows; a lone last row is dropped
                continue
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
                logits = model(train_x[idx]).float()
            if train_soft is not None:
                loss = target_loss(logits, train_soft[idx], soft_kind)
            else:
                loss = loss_fn(logits, train_y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if recipe.grad_clip:
                nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip)
            opt.step()
            sched.step()
            if ema is not None:
                ema.update()
            total_loss += loss.detach() * len(idx)
            if progress is not None:
                progress.update(len(idx))
        scored = ema.shadow if ema is not None else model
        curves["train_loss"].append(float(total_loss) / n)
        curves["lr"].append(float(opt.param_groups[0]["lr"]))
        val_acc = val_score = float("nan")
        if len(val_y):
            logits = predict_logits(scored, val_x, recipe.eval_batch, autocast)
            val_acc = float((logits.argmax(dim=1) == val_y).float().mean())
            val_score = _val_score(scored, val_x, val_y, val_soft, recipe, autocast, logits)
            if recipe.stack:
                epoch_weights, val_score = stack_weights(z_val, logits, val_y, val_soft)
                curves["stack_weights"].append(epoch_weights)
        curves["val_accuracy"].append(val_acc)
        curves["val_score"].append(val_score)
        if test_x is not None:
            curves["test_accuracy"].append(
                float((predict(scored, test_x, recipe.eval_batch, autocast) == test_y).float().mean())
            )
        if len(val_y) and recipe.selection != "last":
            crit = -val_acc if recipe.selection == "val_accuracy" else val_score
            if crit < best:
                best, best_epoch = crit, epoch
                best_state = {k: v.detach().clone() for k, v in scored.state_dict().items()}
                if recipe.stack:
                    weights = epoch_weights
        if progress is not None:
            progress.set_postfix(loss=f"{curves['train_loss'][-1]:.3f}", val=f"{val_score:.3f}")
    scored = ema.shadow if ema is not None else model
    if best_state is not None:
        scored.load_state_dict(best_state)
    if recipe.stack:
        if recipe.selection == "last" and curves["stack_weights"]:
            weights = curves["stack_weights"][-1]
        a, c = weights if weights is not None else (0.0, 1.0)  # no hold-out: the network alone
        scored = Stacked(scored, *start, a, c).to(device)  # c = 0: the probe alone; the network kept
        curves["kept_weights"] = [a, c]
    curves["selected_epoch"] = best_epoch
    curves["batch_size"] = batch_size
    return scored, curves


def _val_score(model, val_x, val_y, val_soft, recipe: Recipe, autocast: bool, logits=None) -> float:
    """The synthetic hold-out's proper score (lower is better): ``recipe.soft_loss`` against the released label
    scores, else cross-entropy without smoothing against the labels."""
    if logits is None:
        logits = predict_logits(model, val_x, recipe.eval_batch, autocast)
    if val_soft is not None:
        return float(target_loss(logits, val_soft, recipe.soft_loss))
    return float(nn.functional.cross_entropy(logits, val_y))
