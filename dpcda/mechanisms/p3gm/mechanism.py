"""P3GM's plan (its noise, schedule and events, manifest section) and its registry entry."""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction
from typing import Optional

from dpcda.mechanisms.base import Caveat, CaveatCode, Grouping, InProcess, Mechanism, Public, SynthesisPlan
from dpcda.mechanisms.dppca import PcaPlan
from dpcda.mechanisms.p3gm.sample import check_shapes, fit, sample_chunks, sample_rows, spec_from_plan
from dpcda.mechanisms.p3gm.spec import SGD_ROW_CHECK, em_sensitivity
from dpcda.privacy.budget import Share, calibrate_synthesis
from dpcda.schemas.mechanism_params import P3gmParams


@dataclasses.dataclass(frozen=True)
class P3gmPlan(SynthesisPlan):
    """What p3gm's fitting needs (all public or DP): the DP-EM noise and the DP-SGD schedule; its DP-PCA stage."""

    latent_dim: int
    components: int
    em_iterations: int
    em_noise_std: float  # on every coordinate of the EM sufficient statistics (sensitivity em_sensitivity)
    em_sensitivity: float
    em_share: float
    sampling_rate: Fraction  # q = batch / N_hat, exact
    steps: int
    noise_multiplier: float  # z: the noise std on the sum of clipped gradients is z * grad_clip
    grad_clip: float
    lr: float
    hidden: int
    encoder_hidden: int
    epochs: float
    batch: int
    label_weight: float  # of the label cross-entropy (public: the config's, or sqrt(d))
    samples_total: int = 0  # T, the rows sampled from the fitted model
    pca: Optional[PcaPlan] = None  # the DP-PCA basis of the latent space

    @property
    def events(self) -> tuple:
        """DP-SGD's event: the synthesis' (DP-PCA and DP-EM are shares of the budget, composed with it)."""
        from dpcda.privacy.events import DpSgdEvent

        return (DpSgdEvent("dp_sgd", self.sampling_rate, self.steps, self.noise_multiplier),)

    def dp_pca(self) -> Optional[PcaPlan]:
        return self.pca

    def summary(self) -> str:
        return f"em_noise_std={self.em_noise_std:.6g} noise_multiplier={self.noise_multiplier:.6g} steps={self.steps}"

    def noise_stds(self) -> dict:
        return {
            "pca_covariance": self.pca.noise_std if self.pca else None,
            "dp_em": self.em_noise_std,
            "dp_sgd": self.noise_multiplier * self.grad_clip if self.noise_multiplier else 0,
        }

    def gaussian_draws(self, *, dim: int, num_classes: int) -> int:
        """One per parameter per DP-SGD step, the EM statistics per iteration, the covariance's upper triangle."""
        params = p3gm_parameters(dim, num_classes, self.latent_dim, self.hidden, self.encoder_hidden)
        sgd = self.steps * params * (self.noise_multiplier > 0)
        em = self.em_iterations * self.components * (1 + 2 * self.latent_dim) * (self.em_noise_std > 0)
        return sgd + em + dim * (dim + 1) // 2 * (self.pca is not None)

    def caveats(self, epsilon: float, mechanism: str) -> tuple[Caveat, ...]:
        return () if math.isfinite(epsilon) else (Caveat(CaveatCode.MODEL_WITHOUT_NOISE, mechanism=mechanism),)

    def account_figures(self, clip: float) -> dict:
        return {
            "pca_covariance_noise_std": self.pca.noise_std if self.pca else None,
            "em_noise_std": self.em_noise_std,
            "em_sensitivity": self.em_sensitivity,
            "sgd_noise_multiplier": self.noise_multiplier,
            "sgd_sampling_rate": float(self.sampling_rate),
            "sgd_steps": self.steps,
        }

    def manifest_section(self, plan, *, chunk_rows):
        from dpcda.schemas.manifest import P3gmMechanism

        return P3gmMechanism(
            name="p3gm",
            mode=plan.mode,
            clip=plan.clip,
            num_classes=plan.num_classes,
            samples_total=self.samples_total,
            dataset_size_dp=plan.dp_dataset_size,
            latent_dim=self.latent_dim,
            pca_covariance_noise_std=self.pca.noise_std if self.pca else None,
            pca_epsilon_share=self.pca.share if self.pca else None,
            em={
                "components": self.components,
                "iterations": self.em_iterations,
                "noise_std": self.em_noise_std,
                "sensitivity": self.em_sensitivity,
                "epsilon_share": self.em_share,
            },
            dp_sgd={
                "sampling_rate": float(self.sampling_rate),
                "steps": self.steps,
                "noise_multiplier": self.noise_multiplier,
                "clip": self.grad_clip if math.isfinite(self.grad_clip) else None,
                "lr": self.lr,
                "epochs": self.epochs,
                "expected_batch": self.batch,
                "hidden": self.hidden,
                "encoder_hidden": self.encoder_hidden,
                "label_weight": self.label_weight,
                "per_record_check": SGD_ROW_CHECK,
            },
            sampling="z from the DP mixture prior, the row = the decoder's feature means, the label = the argmax of "
            "its label scores (mechanisms.p3gm)",
        )


def p3gm_parameters(dim: int, K: int, latent: int, hidden: int, encoder_hidden: Optional[int] = None) -> int:
    """Weights and biases of p3gm's encoder [d, e, d'] (e: ``encoder_hidden``, default h), decoder [d', h, d + K]."""
    e = hidden if encoder_hidden is None else encoder_hidden
    return dim * e + e + e * latent + latent + latent * hidden + hidden + hidden * (dim + K) + dim + K


class P3gm(Mechanism):
    """Seed 004: rows sampled from a generative model whose every fitted quantity is DP (DP-PCA, DP-EM, DP-SGD)."""

    name = "p3gm"
    composition = "sequential: the statistics, the DP-PCA covariance, DP-EM and DP-SGD over the whole dataset"
    params = P3gmParams
    grouping = Grouping.DATASET
    graph = "dpcda.transforms.synthesize:FitAndSampleP3gm"
    audit_game = "dpcda.evaluation.audit.games:DpSgdStep"
    one_worker = "p3gm fits its model on one worker; raise --max-class-bytes on bigger workers"
    fits_model = True

    def budget_shares(self, privacy, params) -> list:
        """DP-EM: its iterations spend their own share alone (sigma_x 0: no noise, the non-private reference)."""
        return [
            Share(
                "dp_em",
                params.em_budget_share,
                em_sensitivity(),
                iterations=params.em_iterations,
                noise=privacy.sigma_x != 0,
            )
        ]

    def plan(self, public: Public) -> P3gmPlan:
        """DP-EM's noise comes from the budget planner (``budget_shares``); the DP-SGD noise multiplier is then
        calibrated so that everything (statistics, DP-PCA, DP-EM, DP-SGD) composes to the rest of the target."""
        from dpcda.privacy.events import DpSgdEvent

        privacy, params, budget = public.privacy, public.params, public.budget
        n = max(int(public.records), 1)
        rate = Fraction(min(params.batch, n), n)
        steps = max(1, math.ceil(params.epochs / rate))
        em = budget.get("dp_em")
        z = 0.0  # sigma_x 0: no noise, the non-private reference (epsilon infinite)
        if privacy.sigma_x != 0:
            z = calibrate_synthesis(budget, lambda s: [DpSgdEvent("dp_sgd", rate, steps, s)])
        return P3gmPlan(
            latent_dim=params.latent_dim,
            components=params.components,
            em_iterations=params.em_iterations,
            em_noise_std=em.noise_std,
            em_sensitivity=em.event.sensitivity,
            em_share=params.em_budget_share,
            sampling_rate=rate,
            steps=steps,
            noise_multiplier=z,
            grad_clip=params.grad_clip if z > 0 else math.inf,
            lr=params.lr,
            hidden=params.hidden,
            encoder_hidden=params.hidden if params.encoder_hidden is None else params.encoder_hidden,
            epochs=params.epochs,
            batch=params.batch,
            label_weight=math.sqrt(public.dim) if params.label_weight is None else float(params.label_weight),
            samples_total=public.samples,
            pca=public.pca,
        )

    def check_before_work(self, core, dim: int) -> None:
        from dpcda.mechanisms.device import pick_device

        params = core.params
        check_shapes(
            dim=dim,
            num_classes=core.data.num_classes,
            latent_dim=params.latent_dim,
            components=params.components,
            hidden=params.hidden,
            encoder_hidden=params.encoder_hidden,
            device=pick_device(core.execution.device),
        )

    def label_caveat(self) -> str:
        return (
            "p3gm: the released rows and labels are sampled from a model whose every fitted quantity is DP (the "
            "DP-PCA basis, the DP-EM mixture prior, the VAE trained with DP-SGD): sampling is post-processing."
        )

    def synthesize(self, ctx: InProcess):
        plan = ctx.plan
        spec = spec_from_plan(plan)
        x = ctx.normalized(ctx.x)
        model = fit(x, ctx.y, ctx.basis, plan.clip, spec, ctx.key, ctx.device, progress=ctx.progress)
        if ctx.on_model is not None:
            ctx.on_model(model, spec)
        for chunk, rows in sample_chunks(plan, ctx.core.execution.chunk_rows):
            f, lab = sample_rows(model, spec, rows=rows, chunk=chunk, key=ctx.key, clip=plan.clip, device=ctx.device)
            yield f, lab, None
