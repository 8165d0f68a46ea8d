"""The plans of the mechanisms that release noisy rows (``dpcda``, ``dpmix``, ``local``, ``randproj``): the feature
noise sigma_x on every released row, the optional image post-processing, and for the mixers their rows per group,
sampling rates, mixing paths and an optional DP-PCA basis. Each mechanism's own plan extends one of these."""

from __future__ import annotations

import dataclasses
from fractions import Fraction
from typing import Optional

from dpcda.mechanisms.base import Caveat, CaveatCode, Grouping, Public, SynthesisPlan
from dpcda.mechanisms.memory import join_block_rows


@dataclasses.dataclass(frozen=True)
class RowsPlan(SynthesisPlan):
    """Rows released with Gaussian noise of std ``sigma_x`` on every feature (in the z-scored, clipped units)."""

    events: tuple  # one per group (parallel composition)
    samples_total: int
    sigma_x: float
    post: object = None  # mechanisms.postprocess.ImagePost, or None

    @property
    def sigma_y(self) -> float:
        """The label noise std (0: the labels are released as they are)."""
        return 0.0

    @property
    def lowpass(self) -> Optional[tuple]:
        return self.post.lowpass if self.post is not None else None

    @property
    def denoise_spec(self) -> Optional[tuple]:
        return self.post.denoise_spec if self.post is not None else None

    def postprocessing(self):
        return self.post.section() if self.post is not None else None

    def summary(self) -> str:
        return f"sigma_x={self.sigma_x:.6g}"

    def noise_stds(self) -> dict:
        return {"features": self.sigma_x, "labels": self.sigma_y}

    def noised_dim(self, dim: int) -> int:
        """The width of the rows the noise is drawn on."""
        return dim

    def gaussian_draws(self, *, dim: int, num_classes: int) -> int:
        return self.samples_total * self.noised_dim(dim) * (self.sigma_x > 0) + self.samples_total * num_classes * (
            self.sigma_y > 0
        )

    def caveats(self, epsilon: float, mechanism: str) -> tuple[Caveat, ...]:
        return (Caveat(CaveatCode.NO_FEATURE_NOISE),) if self.sigma_x == 0 else ()

    def common(self, plan) -> dict:
        """The manifest fields every row mechanism states alike."""
        worst = plan.accounting.worst_class_event
        return dict(
            mode=plan.mode,
            clip=plan.clip,
            sigma_x=self.sigma_x,
            noise_multiplier=worst.noise_multiplier if worst else 0.0,
            num_classes=plan.num_classes,
            samples_total=self.samples_total,
        )

    def account_figures(self, clip: float) -> dict:
        ev = self.events[0]
        return {
            "sigma_x": self.sigma_x,
            "sigma_x_over_c": self.sigma_x / clip,
            **self.own_figures(),
            "noise_multiplier": ev.noise_multiplier,
            "sampling_rate": getattr(ev, "sampling_rate", 1.0),
        }

    def own_figures(self) -> dict:
        """The mechanism's own figures beside sigma_x (dpmix: sigma_y; randproj: the projection's norm)."""
        return {}


@dataclasses.dataclass(frozen=True)
class MixingPlan(RowsPlan):
    """Rows that each average ``mixing_order`` records of one group, plus noise; the groups' rows, sampling rates and
    paths (``grouping``: per class or the whole dataset), and the DP-PCA basis they are mixed in, if any."""

    grouping: Grouping = Grouping.CLASS
    mixing_order: int = 1
    samples_per_class: tuple[int, ...] = ()  # per class: T_k of each class; the whole dataset: ()
    sampling_rates: tuple[Fraction, ...] = ()  # exact q per group, rounded up for the accountant
    mixing_paths: tuple[str, ...] = ()  # per group: 'memory' or 'join'
    join_block_rows: int = 0  # R of the join path (mechanisms.joinmix)
    pca: object = None  # mechanisms.dppca.PcaPlan, or None

    def dp_pca(self):
        return self.pca

    def noised_dim(self, dim: int) -> int:
        return self.pca.components if self.pca is not None else dim  # the noise is drawn in K dimensions

    def gaussian_draws(self, *, dim: int, num_classes: int) -> int:
        pca = dim * (dim + 1) // 2 * (self.pca is not None)  # the covariance's upper triangle
        return super().gaussian_draws(dim=dim, num_classes=num_classes) + pca

    def noise_stds(self) -> dict:
        return {**super().noise_stds(), "pca_covariance": self.pca.noise_std if self.pca else None}

    def projection(self) -> Optional[dict]:
        return self.pca.section() if self.pca is not None else None

    @staticmethod
    def fields(public: Public, grouping: Grouping, events: tuple, sigma_x: float, samples_total: int) -> dict:
        """What every mixing plan takes alike from its public facts and its calibrated events."""
        joins = "join" in public.mixing_paths  # R of the join path: only where a group takes it
        return dict(
            events=events,
            samples_total=samples_total,
            sigma_x=sigma_x,
            post=public.post,
            grouping=grouping,
            mixing_order=public.params.mixing_order,
            sampling_rates=tuple(e.exact_sampling_rate for e in events),
            mixing_paths=public.mixing_paths,
            join_block_rows=join_block_rows(public.dim, public.core.execution.join_block_rows) if joins else 0,
            pca=public.pca,
        )

    @property
    def join_groups(self) -> tuple[int, ...]:
        return tuple(g for g, p in enumerate(self.mixing_paths) if p == "join")

    def group_records(self, class_rows, g: int) -> int:
        """Exact records of group g (private: the join path's index range)."""
        return self.grouping.records(class_rows, g)

    def group_samples(self, g: int) -> int:
        return self.samples_per_class[g] if self.grouping is Grouping.CLASS else self.samples_total

    def summary(self) -> str:
        rows = ",".join(map(str, self.samples_per_class)) if self.samples_per_class else str(self.samples_total)
        return f"{super().summary()} l={self.mixing_order} T{'_k' if self.samples_per_class else ''}={rows}"
