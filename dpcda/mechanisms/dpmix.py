"""DPMix (seed 001): each synthetic row mixes ``l`` records of the WHOLE dataset, features and one-hot labels.

Row t: (mean of the l records' features + N(0, sigma_x^2 I), mean of their one-hot labels + N(0, sigma_y^2 I_K)),
released as features, the K label scores (``LABEL_soft``) and their argmax (``LABEL``). The indices come from the
stream ("dpmix-index", chunk), the feature noise from ("dpmix-noise", chunk), the label noise from ("dpmix-label",
chunk) (``privacy.noise``). fixed: l distinct records of the N, uniformly; poisson: each record joins with
probability q = l / N_hat, the sums divided by l. Sensitivity and accounting: ``privacy.events.DpmixEvent`` (the
records are clipped and summed exactly as in ``mechanisms.dpcda``, whose docstring states the float bound). Seed 001's
denoising (a Gaussian blur) is post-processing (``mechanisms.postprocess``).
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction
from typing import Iterator, Optional, Sequence

import numpy as np
import torch

from dpcda.mechanisms.base import Grouping, InProcess, Mechanism, Public, noise_for
from dpcda.mechanisms.device import ahead, lookahead, stream_device
from dpcda.mechanisms.dpcda import canonical_order, mean_rows, sample_index_tensors, start_noisy_rows
from dpcda.mechanisms.postprocess import make_postprocess
from dpcda.mechanisms.rows import MixingPlan
from dpcda.privacy.events import DpmixEvent
from dpcda.privacy.noise import NoiseStream
from dpcda.schemas.mechanism_params import DpmixParams


def mix_dataset(
    features: np.ndarray,
    labels: np.ndarray,
    *,
    key: bytes,
    num_classes: int,
    mode: str,
    mixing_order: int,
    sigma_x: float,
    sigma_y: float,
    samples: int,
    chunk_rows: int,
    sampling_rate: Fraction | float = Fraction(0),
    device: str | torch.device = "cpu",
    chunks=None,
    lowpass: Optional[tuple[Sequence[int], int]] = None,
    denoise: Optional[tuple[Sequence[int], float]] = None,
    basis: Optional[np.ndarray] = None,
    clip: float = 1.0,
    depth: Optional[int] = None,
) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """Yield (chunk, float32 features (rows, d), float32 label scores (rows, K)) for the whole dataset.

    ``basis``: a DP-PCA basis, ``depth``: how many chunks the draws run ahead, as in ``mechanisms.dpcda.mix_class``."""
    dev = torch.device(device) if not isinstance(device, torch.device) else device
    if basis is not None:
        from dpcda.mechanisms.dppca import project_rows

        features = project_rows(features, basis, clip)
    labels = np.asarray(labels, np.int64)
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(f"labels must lie in [0, {num_classes})")
    order = canonical_order(features, labels)
    x = torch.from_numpy(np.ascontiguousarray(features, np.float64)).to(dev)
    dev = x.device  # with its index: a draw made in another thread must not take that thread's current card
    order_t = torch.from_numpy(order).to(dev)
    y = labels[order]  # labels in the canonical order the indices refer to
    rate = Fraction(sampling_rate)
    post = make_postprocess(lowpass=lowpass, denoise=denoise, device=dev)
    n_chunks = -(-samples // chunk_rows)
    dtype = np.float64 if basis is not None else np.float32  # the rows as cast where they are drawn

    def started():  # the draws of each chunk, ``depth`` chunks ahead of the one being finished (``device.ahead``)
        for chunk in range(n_chunks) if chunks is None else chunks:
            rows = min(chunk_rows, samples - chunk * chunk_rows)
            flat, offsets = sample_index_tensors(
                x.shape[0],
                mode=mode,
                mixing_order=mixing_order,
                rows=rows,
                stream=NoiseStream(key, "dpmix-index", chunk, device=stream_device(dev)),
                sampling_rate=rate,
                device=dev,
            )
            means = mean_rows(x, flat, offsets, mixing_order, order_t)
            flat, offsets = flat.cpu().numpy(), offsets.cpu().numpy()
            stream = NoiseStream(key, "dpmix-noise", chunk)
            yield chunk, rows, flat, offsets, start_noisy_rows(means, sigma_x, stream, dtype)

    for chunk, rows, flat, offsets, copy in ahead(started(), lookahead(dev, depth)):
        counts = np.zeros((rows, num_classes), np.float64)
        row_of = np.repeat(np.arange(rows), np.diff(np.append(offsets, len(flat))))
        np.add.at(counts, (row_of, y[flat]), 1.0)
        out = copy.result()
        feats = (out @ basis.T).astype(np.float32) if basis is not None else out
        scores = NoiseStream(key, "dpmix-label", chunk).gaussian(counts / mixing_order, sigma_y)
        if post is not None:
            feats = post(feats)
        yield chunk, feats, scores.astype(np.float32)


# ---------------------------------------------------------------- the plan and the registry entry


@dataclasses.dataclass(frozen=True)
class DpmixPlan(MixingPlan):
    """DPMix's plan: T rows of the whole dataset, features and label scores noised (sigma_y = ratio x sigma_x)."""

    label_noise_ratio: float = 1.0

    @property
    def sigma_y(self) -> float:
        return self.label_noise_ratio * self.sigma_x

    def own_figures(self) -> dict:
        return {"sigma_y": self.events[0].sigma_y}

    def manifest_section(self, plan, *, chunk_rows):
        from dpcda.schemas.manifest import DpmixMechanism

        return DpmixMechanism(
            name="dpmix",
            sampling=Dpmix.SAMPLING_WORDS[plan.mode],
            mixing_order=self.mixing_order,
            sigma_y=self.sigma_y,
            label_noise_ratio=self.label_noise_ratio,
            dataset_size=int(sum(plan.public_class_sizes)) if plan.public_class_sizes else None,
            dataset_size_dp=plan.dp_dataset_size,
            sampling_rate=float(self.sampling_rates[0]),
            chunk_rows=chunk_rows,
            postprocessing=self.postprocessing(),
            mixing_paths=list(self.mixing_paths),
            projection=self.projection(),
            **self.common(plan),
        )


class Dpmix(Mechanism):
    """Seed 001: each row mixes l records of the whole dataset, features and one-hot labels, plus noise."""

    name = "dpmix"
    composition = "one group, the whole dataset (a record may meet any row); sequential with the statistics releases"
    params = DpmixParams
    grouping = Grouping.DATASET
    label_scores = True
    graph = "dpcda.transforms.synthesize:MixWholeDataset"
    audit_game = "dpcda.evaluation.audit.games:DatasetMixing"
    fixed_caveat = (
        "fixed mode: the dataset size is public and stated here; the guarantee covers replacing one record (its "
        "features and label)."
    )
    SAMPLING_WORDS = {
        "fixed": "exactly l distinct records of the whole dataset, uniformly without replacement",
        "poisson": "each record of the dataset independently with probability q = l / N_hat; sums divided by l",
    }

    def synthesis_events(self, mode, *, group_sizes, samples, mixing_order, clip, sigma_x, label_noise_ratio, **_):
        n, l = int(group_sizes[0]), mixing_order
        return [DpmixEvent(mode, max(n, l), samples, l, clip, sigma_x, label_noise_ratio * sigma_x)]

    def plan(self, public: Public) -> DpmixPlan:
        params, mode, clip = public.params, public.mode, public.privacy.clip
        ratio, T = params.label_noise_ratio, public.samples

        def events(sigma: float) -> list:
            return self.synthesis_events(
                mode,
                group_sizes=[public.records],
                samples=T,
                mixing_order=params.mixing_order,
                clip=clip,
                sigma_x=sigma,
                label_noise_ratio=ratio,
            )

        sigma_x = noise_for(events, public.budget, public.privacy, clip)
        return DpmixPlan(
            **MixingPlan.fields(public, self.grouping, tuple(events(sigma_x)), sigma_x, T), label_noise_ratio=ratio
        )

    def label_caveat(self) -> str:
        return (
            "DPMix: rows mix records of every class, so the labels are released as noisy one-hot means "
            "(sigma_y = label_noise_ratio x sigma_x) and their noise is part of the accounted event."
        )

    def synthesize(self, ctx: InProcess):
        plan = ctx.plan
        mix: DpmixPlan = plan.synthesis
        for _, f, sc in mix_dataset(
            ctx.normalized(ctx.x),
            ctx.y,
            key=ctx.key,
            num_classes=plan.num_classes,
            mode=plan.mode,
            mixing_order=mix.mixing_order,
            sigma_x=mix.sigma_x,
            sigma_y=mix.sigma_y,
            samples=mix.samples_total,
            chunk_rows=ctx.core.execution.chunk_rows,
            sampling_rate=mix.sampling_rates[0],
            device=ctx.device,
            lowpass=mix.lowpass,
            denoise=mix.denoise_spec,
            basis=ctx.basis,
            clip=plan.clip,
        ):
            yield f, sc.argmax(axis=1), sc
