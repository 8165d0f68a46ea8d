"""The evaluation's training recipes: ``Recipe`` (hyper-parameters), the named ``RECIPES``, and where bf16 runs.

Why each choice, with the measurements behind it: docs/evaluation.md. Torch only (no Beam).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional

import torch

from dpcda.evaluation.models import NORMS


@dataclasses.dataclass(frozen=True)
class Recipe:
    """Training hyper-parameters. Defaults are the stable recipe docs/evaluation.md explains."""

    batch_size: int = 256
    lr: float = 1e-3
    weight_decay: float = 0.0
    warmup_fraction: float = 0.05
    schedule: str = "cosine"  # cosine | constant
    label_smoothing: float = 0.1
    grad_clip: Optional[float] = 1.0
    ema_decay: Optional[float] = 0.995  # per step; None: evaluate the raw weights
    val_fraction: float = 0.1
    selection: str = "last"  # last | val_score (proper score on released targets) | val_accuracy (hard labels only)
    soft_loss: str = "standardized"  # standardized | brier | cross_entropy (raw scores) | clipped (clip, renormalise)
    row_scale: bool = True
    dropout: Optional[float] = 0.0  # None: the model's own (Table 1: 0.5); see docs/evaluation.md
    norm: str = "group"  # the CNN's normalisation layers: group | batch (the Table 1 network's; models.NORMS)
    eval_batch: int = 512
    precision: str = "auto"  # auto | float32 | bf16 (autocast for the forward pass; ``use_bf16``)
    channels_last: bool = True  # memory format of the CNN
    stack: bool = True  # the network trained alone, then a (x W + b) + c f(x), (a, c) fitted on the hold-out (Stacked)
    probe_start: bool = False  # the probe's linear map plus the network, trained from the probe (ProbeStart)

    def __post_init__(self):
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if not 0.0 <= self.val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in [0, 1), got {self.val_fraction}")
        if self.schedule not in ("cosine", "constant"):
            raise ValueError(f"schedule must be 'cosine' or 'constant', got {self.schedule!r}")
        if self.ema_decay is not None and not 0.0 < self.ema_decay < 1.0:
            raise ValueError(f"ema_decay must be in (0, 1) or None, got {self.ema_decay}")
        if self.selection not in ("last", "val_accuracy", "val_score"):
            raise ValueError(f"selection must be last, val_accuracy or val_score, got {self.selection!r}")
        if self.soft_loss not in ("brier", "standardized", "cross_entropy", "clipped"):
            raise ValueError(f"soft_loss must be brier, standardized, cross_entropy or clipped, got {self.soft_loss!r}")
        if self.stack and (self.probe_start or self.selection == "val_accuracy"):
            raise ValueError("stack trains the network alone (probe_start off) and keeps the last or val_score epoch")
        if self.norm not in NORMS:
            raise ValueError(f"norm must be one of {sorted(NORMS)}, got {self.norm!r}")
        if self.precision not in ("auto", "float32", "bf16"):
            raise ValueError(f"precision must be auto, float32 or bf16, got {self.precision!r}")


# Named recipes: "stacked" is the default; "probed" a study beside it; "grouped", "scaled", "new" and "old" are the
# recipes before it, kept to reproduce older tables (on hard labels "scaled" and "new" train alike).
RECIPES = {
    "stacked": Recipe(),
    "probed": Recipe(stack=False, probe_start=True, selection="val_score"),
    "grouped": Recipe(stack=False, selection="last"),
    "scaled": Recipe(norm="batch", stack=False, selection="last"),
    "new": Recipe(soft_loss="brier", norm="batch", stack=False, selection="last"),
    "old": Recipe(selection="val_accuracy", soft_loss="clipped", dropout=None, norm="batch", stack=False),
    # the steps between "old" and "new", for benchmarks.studies.dpmix_recipe
    "last": Recipe(soft_loss="clipped", dropout=None, norm="batch", stack=False, selection="last"),
    "last+brier": Recipe(soft_loss="brier", dropout=None, norm="batch", stack=False, selection="last"),
    "last+cross_entropy+dropout0": Recipe(soft_loss="cross_entropy", norm="batch", stack=False, selection="last"),
}


def same_training(a: Recipe, b: Recipe, soft_labels: bool) -> bool:
    """True when the two recipes train alike on a release with (``soft_labels``) or without label scores: without
    them ``soft_loss`` is never used."""
    return a == b if soft_labels else dataclasses.replace(a, soft_loss=b.soft_loss) == b


def cpu_flags() -> set:
    """The CPU's feature flags (``/proc/cpuinfo``; empty where it cannot be read)."""
    try:
        with open("/proc/cpuinfo") as fh:
            return set(fh.read().split())
    except OSError:
        return set()


def cpu_has_bf16() -> bool:
    """True where bf16 autocast is faster than float32: the CPU has AMX (its bf16 tiles), and neither torch's kernel
    dispatch (``ATEN_CPU_CAPABILITY``) nor oneDNN (``ONEDNN_MAX_CPU_ISA``) is held below it. AVX-512 BF16 alone is
    not enough: on a 2-core AMD EPYC with AVX-512 BF16 and no AMX, the first command's evaluation ran at 2,691
    training rows/s under bf16 autocast against 4,126 in float32 (``python -m benchmarks.perf.bench_train
    --first-command``, and the same with ``ONEDNN_MAX_CPU_ISA=AVX512_CORE``, one after the other on the idle box);
    on the Intel Xeon with AMX, bf16 gave 2.4x float32. On an AVX2-only CPU bf16 is emulated and slower still."""
    if "amx_bf16" not in cpu_flags():
        return False
    if not torch.backends.cpu.get_cpu_capability().upper().startswith("AVX512"):
        return False
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "ALL").upper()
    return isa == "ALL" or "AMX" in isa


def kernel_path(recipe: Optional["Recipe"] = None, device: str = "cpu") -> dict:
    """What the evaluation runs on here: torch's CPU kernel level, the CPU's vector flags, bf16 or float32."""
    dev = torch.device(device)
    flags = cpu_flags()
    return {
        "device": str(dev),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_flags": sorted(flags & {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}),
        "precision": "bf16 autocast" if use_bf16(recipe or Recipe(), dev) else "float32",
        "limits": {k: os.environ[k] for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA") if k in os.environ},
        "threads": torch.get_num_threads(),
    }


def use_bf16(recipe: "Recipe", device: torch.device) -> bool:
    if recipe.precision != "auto":
        return recipe.precision == "bf16"
    return device.type == "cuda" or (device.type == "cpu" and cpu_has_bf16())


def recipe_name(recipe: Recipe) -> str:
    """The recipe in words, for reports."""
    pick = {
        "last": "the last iterate of a fixed schedule",
        "val_accuracy": "the epoch with the best accuracy on the synthetic hold-out's labels",
        "val_score": "the epoch with the best proper score on the synthetic hold-out's released targets",
    }[recipe.selection]
    soft = {
        "brier": "squared error to the released scores as released",
        "standardized": "squared error of the outputs to the released scores standardised by one affine map",
        "cross_entropy": "cross-entropy to the released scores as released",
        "clipped": "cross-entropy to the scores clipped at 0 and renormalised",
    }[recipe.soft_loss]
    norm = {"group": "GroupNorm in place of the CNN's BatchNorm", "batch": "the CNN's BatchNorm"}[recipe.norm]
    start = "; the linear probe's map plus the network, started at the probe" if recipe.probe_start else ""
    if recipe.stack:
        start = "; the linear probe's map beside the network, weights (>= 0) fitted on the synthetic hold-out"
    return (
        f"Adam lr {recipe.lr:g}, {recipe.schedule} schedule, EMA {recipe.ema_decay}; {norm}{start}; "
        f"model kept: {pick}; hard labels: cross-entropy (smoothing {recipe.label_smoothing:g}); "
        f"soft label scores: {soft}"
    )
