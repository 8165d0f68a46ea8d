"""Beam-free DP-CDA mixing (seed 000, Algorithm 1, steps 8-14): indices and noise from ``privacy.noise``.

One class at a time: ``T_k`` synthetic rows in chunks of ``chunk_rows``. Each chunk draws its indices from the
stream ("mix-index", k, chunk) and its noise from ("mix-noise", k, chunk), so a retried chunk reproduces its rows.
Rows are gathered and summed with ``embedding_bag`` in float64 (CUDA when present, the same code on the CPU; no
(rows, l, d) intermediate), then the noise is drawn where the rows are (on CUDA: ``privacy.noise.device``, the same
output bit for bit; elsewhere on the host); on CUDA the indices and poisson row sizes are drawn on the card too (the
same indices, element for element): every released value is
``g * round((mean + sigma_x Z) / g)`` (``NoiseStream.gaussian``).

fixed: each row averages exactly ``l`` distinct records, a uniform l-subset (exact).
poisson: each record joins a row independently with probability q (m ~ Binomial(N_k, q) by exact inversion, then a
uniform m-subset); the sum is divided by ``l``, not m, so the sensitivity stays c / l.

Sensitivity in the bits. Records reach the mixer clipped to ``c (1 - CLIP_MARGIN)`` (``plan.normalize``; float32
rounding keeps them below ``c (1 - 2^-21)``). The mean is computed as fl(fl(sum)/l) in float64, whose error is at
most gamma_{m-1} m c / l + 2^-53 m c / l in L2 (m <= MAX_ROW_RECORDS records per row, gamma_j = j 2^-53 / (1 - j
2^-53)); two neighbouring outputs therefore differ by at most (2c/l) (1 - 2^-21 + m^2 2^-52) <= 2c/l (fixed) and
c/l (poisson) in L2, the sensitivities the accountant assumes.

Optional low-pass post-processing (``lowpass``, ``mechanisms.postprocess``) acts on the finished noisy rows only.
"""

from __future__ import annotations

import dataclasses
import logging
from fractions import Fraction
from typing import Iterator, Optional, Sequence

import numpy as np
import torch

from dpcda.mechanisms.base import Grouping, InProcess, Mechanism, PlanError, Public, noise_for
from dpcda.mechanisms.device import HostCopy, ahead, lookahead, stream_device
from dpcda.mechanisms.postprocess import make_postprocess
from dpcda.mechanisms.rows import MixingPlan
from dpcda.privacy.events import MAX_ROW_RECORDS, MixingEvent
from dpcda.privacy.noise import NoiseStream
from dpcda.schemas.mechanism_params import DpcdaParams

log = logging.getLogger(__name__)


def canonical_order(features: np.ndarray, labels: Optional[np.ndarray] = None) -> np.ndarray:
    """A permutation sorting rows by their bytes (then by label): the order rows arrive in never changes the output."""
    rows = np.ascontiguousarray(features)
    keys = rows.view(np.dtype((np.void, rows.shape[1] * rows.itemsize))).ravel()
    order = np.argsort(keys, kind="stable")
    if labels is None or len(order) < 2:
        return order
    sorted_keys = keys[order]
    rank = np.empty(len(order), np.int64)  # equal rows share a rank; labels then break the tie
    rank[order] = np.concatenate([[0], np.cumsum(sorted_keys[1:] != sorted_keys[:-1])])
    return np.lexsort((np.asarray(labels), rank))


def sample_rows(
    n: int, *, mode: str, mixing_order: int, rows: int, stream: NoiseStream, sampling_rate: Fraction = Fraction(0)
) -> tuple[np.ndarray, np.ndarray]:
    """(flat indices, offsets): row i holds indices flat[offsets[i]:offsets[i+1]] into range(n)."""
    flat, offsets = sample_index_tensors(
        n, mode=mode, mixing_order=mixing_order, rows=rows, stream=stream, sampling_rate=sampling_rate
    )
    return flat.cpu().numpy(), offsets.cpu().numpy()


def sample_index_tensors(
    n: int,
    *,
    mode: str,
    mixing_order: int,
    rows: int,
    stream: NoiseStream,
    sampling_rate: Fraction = Fraction(0),
    device=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``sample_rows``'s (flat indices, offsets) as int64 tensors on ``device`` (default: the stream's device, else
    the CPU): a card's draws stay on the card; the host's are wrapped without a copy."""
    dev = torch.device(device if device is not None else (stream.device or "cpu"))
    as_t = lambda a: torch.as_tensor(a, device=dev)  # noqa: E731
    if mode == "fixed":
        idx = as_t(stream.distinct(n, mixing_order, rows, tensor=True))
        return idx.reshape(-1), torch.arange(rows, dtype=torch.int64, device=dev) * mixing_order
    m = as_t(stream.binomial(n, sampling_rate, rows, tensor=True))
    width = int(m.max()) if rows else 0
    if width > MAX_ROW_RECORDS:
        raise ValueError(f"a poisson row drew {width} records, above {MAX_ROW_RECORDS}")
    idx = as_t(stream.distinct(n, width, rows, tensor=True))  # uniform order: each row's first m_i, a uniform subset
    keep = torch.arange(width, device=dev)[None, :] < m[:, None]
    offsets = torch.zeros(rows, dtype=torch.int64, device=dev)
    offsets[1:] = torch.cumsum(m, 0)[:-1]
    return idx[keep], offsets


def mean_rows(x: torch.Tensor, flat: torch.Tensor, offsets: torch.Tensor, mixing_order: int, order=None):
    """float64 (rows, d): each row's sum of its sampled records of ``x`` (``embedding_bag``, no (rows, l, d)
    intermediate; ``order`` maps sampled positions to rows of ``x``) divided by ``mixing_order``; zeros on the host
    when every row is empty (an empty poisson class, or q small)."""
    if not flat.numel():
        return torch.zeros((len(offsets), x.shape[1]), dtype=torch.float64)
    idx = flat if order is None else order[flat]
    return torch.nn.functional.embedding_bag(idx, x, offsets, mode="sum") / mixing_order


def start_noisy_rows(means: torch.Tensor, sigma: float, stream: NoiseStream, dtype=np.float64) -> HostCopy:
    """``stream.gaussian(means, sigma)`` as ``dtype`` (float64 or float32), on its way to the host. On a card the
    noise is drawn where the rows are (``privacy.noise.device``: the same output bit for bit) and cast there (float64
    to float32 rounds to nearest-even on both), then copied out through a page-locked buffer without a wait
    (``device.HostCopy``); elsewhere the host draws it."""
    if means.device.type == "cuda":
        return HostCopy(stream.gaussian(means, sigma).to(getattr(torch, np.dtype(dtype).name)))
    return HostCopy(stream.gaussian(means.cpu().numpy(), sigma).astype(dtype, copy=False))


def mix_chunk(x: torch.Tensor, **kwargs) -> np.ndarray:
    """``rows`` synthetic feature rows (numpy, ``dtype``: float64, or float32 rounded from them) from the float64
    class matrix ``x`` (on its device): ``start_chunk``, finished at once."""
    return start_chunk(x, **kwargs).result()


def start_chunk(
    x: torch.Tensor,
    *,
    mode: str,
    mixing_order: int,
    sigma_x: float,
    rows: int,
    index_stream: NoiseStream,
    noise_stream: NoiseStream,
    sampling_rate: Fraction = Fraction(0),
    order: Optional[torch.Tensor] = None,
    dtype=np.float64,
) -> HostCopy:
    """``mix_chunk``'s rows on their way to the host: on a card, every step queued and the copy out started.

    ``order`` (optional) maps sampled positions to rows of ``x`` (the canonical order of the class).
    """
    if mode == "fixed" and mixing_order > MAX_ROW_RECORDS:
        raise ValueError(f"mixing_order {mixing_order} is above {MAX_ROW_RECORDS}")
    flat, offsets = sample_index_tensors(
        x.shape[0],
        mode=mode,
        mixing_order=mixing_order,
        rows=rows,
        stream=index_stream,
        sampling_rate=sampling_rate,
        device=x.device,
    )
    return start_noisy_rows(mean_rows(x, flat, offsets, mixing_order, order), sigma_x, noise_stream, dtype)


def mixed_features(
    x: torch.Tensor,
    *,
    key: bytes,
    class_index: int,
    mode: str,
    mixing_order: int,
    sigma_x: float,
    samples: int,
    chunk_rows: int,
    chunks=None,
    sampling_rate: Fraction = Fraction(0),
    order: Optional[torch.Tensor] = None,
    dtype=np.float32,
    depth: Optional[int] = None,
) -> Iterator[tuple[int, int, np.ndarray]]:
    """Yield (chunk, rows, the chunk's noisy mean rows as a numpy array of ``dtype``) for class ``class_index`` of
    the float64 class matrix ``x`` (on its device), from the streams ("mix-index", k, chunk) and ("mix-noise", k,
    chunk). The chunks are drawn ``depth`` ahead of the one the caller holds (``device.ahead``; default
    ``device.lookahead``: on a card the next chunk's draws run while the caller finishes this one); the output does
    not depend on it."""
    n_chunks = -(-samples // chunk_rows)
    dev = x.device

    def started():
        for chunk in range(n_chunks) if chunks is None else chunks:
            rows = min(chunk_rows, samples - chunk * chunk_rows)
            yield (
                chunk,
                rows,
                start_chunk(
                    x,
                    mode=mode,
                    mixing_order=mixing_order,
                    sigma_x=sigma_x,
                    rows=rows,
                    index_stream=NoiseStream(key, "mix-index", class_index, chunk, device=stream_device(dev)),
                    noise_stream=NoiseStream(key, "mix-noise", class_index, chunk),
                    sampling_rate=sampling_rate,
                    order=order,
                    dtype=dtype,
                ),
            )

    for chunk, rows, copy in ahead(started(), lookahead(dev, depth)):
        yield chunk, rows, copy.result()


def label_scores(
    class_index: int, num_classes: int, sigma_y: float, rows: int, stream: Optional[NoiseStream]
) -> np.ndarray:
    """(rows, K) float64 scores e_k + N(0, sigma_y^2 I_K) on sigma_y's grid: the one-hot mean of a same-class mix."""
    scores = np.zeros((rows, num_classes), np.float64)
    scores[:, class_index] = 1.0
    return stream.gaussian(scores, sigma_y) if sigma_y > 0 else scores


def noisy_labels(
    class_index: int, num_classes: int, sigma_y: float, rows: int, stream: Optional[NoiseStream]
) -> np.ndarray:
    """argmax(e_k + N(0, sigma_y^2 I_K)); exactly k when sigma_y is 0 (the one-hot mean is e_k)."""
    if sigma_y > 0:
        return label_scores(class_index, num_classes, sigma_y, rows, stream).argmax(axis=1)
    return np.full(rows, class_index, dtype=np.int64)


def mix_class(
    features: np.ndarray,
    *,
    key: bytes,
    class_index: int,
    num_classes: int,
    mode: str,
    mixing_order: int,
    sigma_x: float,
    samples: int,
    chunk_rows: int,
    sampling_rate: Fraction | float = Fraction(0),
    sigma_y: float = 0.0,
    device: str | torch.device = "cpu",
    chunks=None,
    lowpass: Optional[tuple[Sequence[int], int]] = None,
    soft_labels: bool = False,
    denoise: Optional[tuple[Sequence[int], float]] = None,
    basis: Optional[np.ndarray] = None,
    clip: float = 1.0,
    depth: Optional[int] = None,
) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """Yield (chunk, float32 features, labels) for class ``class_index``; ``chunks`` limits which chunks; ``depth``:
    how many chunks the draws run ahead (``mixed_features``).

    ``lowpass=(image_shape, K)`` projects every finished row onto its low DCT frequencies, ``denoise=(image_shape,
    sigma)`` blurs it (post-processing, ``mechanisms.postprocess``).
    ``soft_labels``: labels are the float32 (rows, K) scores e_k + N(0, sigma_y^2 I) instead of their argmax
    (the same draws: the argmax of the scores is the hard label the same key gives).
    ``basis`` (d x K, a DP-PCA basis, ``mechanisms.dppca``): records are mixed as V^T x (norms kept below ``clip``'s
    margin), the noise is K-dimensional, and each row is mapped back, V z, before the other post-processing.
    """
    dev = torch.device(device) if not isinstance(device, torch.device) else device
    if basis is not None:
        from dpcda.mechanisms.dppca import project_rows

        features = project_rows(features, basis, clip)
    order = canonical_order(features)  # sampled positions refer to this order: the input's row order is irrelevant
    x = torch.from_numpy(np.ascontiguousarray(features, np.float64)).to(dev)  # no copy for float64 input on the CPU
    dev = x.device  # with its index: a draw made in another thread must not take that thread's current card
    order_t = torch.from_numpy(order).to(dev)
    rate = Fraction(sampling_rate)
    post = make_postprocess(lowpass=lowpass, denoise=denoise, device=dev)
    for chunk, rows, out in mixed_features(
        x,
        key=key,
        class_index=class_index,
        mode=mode,
        mixing_order=mixing_order,
        sigma_x=sigma_x,
        samples=samples,
        chunk_rows=chunk_rows,
        chunks=chunks,
        sampling_rate=rate,
        order=order_t,
        dtype=np.float64 if basis is not None else np.float32,  # float32 rows: cast where they were drawn
        depth=depth,
    ):
        feats = (out @ basis.T).astype(np.float32) if basis is not None else out
        if post is not None:
            feats = post(feats)
        # Labels draw from their own stream: soft scores publish their noise almost verbatim.
        label_stream = NoiseStream(key, "label", class_index, chunk) if sigma_y > 0 else None
        if soft_labels:
            labels = label_scores(class_index, num_classes, sigma_y, rows, label_stream).astype(np.float32)
        else:
            labels = noisy_labels(class_index, num_classes, sigma_y, rows, label_stream)
        yield chunk, feats, labels


def proportional_rows(total: int, sizes) -> Optional[tuple[int, ...]]:
    """T_k in proportion to the public class sizes N_k (fixed: exact, public; poisson: the DP histogram's, so T_k is
    post-processing of a DP output), summing to T exactly; None where T is below the number of non-empty classes.

    The rule, in exact integer arithmetic: each class gets floor(T N_k / N) rows (N = sum N_k); the rows left over go
    one each to the classes with the largest remainders T N_k mod N (ties: the lower class index). Then each
    non-empty class (N_k > 0) left with no row takes one from the class with the most rows (ties: the lower index),
    so every non-empty class is mixed; an empty class gets no row.
    """
    sizes = [int(n) for n in sizes]
    n = sum(sizes)
    nonempty = sum(s > 0 for s in sizes)
    if n <= 0 or total < nonempty:
        return None
    rows = [total * s // n for s in sizes]
    by_remainder = sorted(range(len(sizes)), key=lambda k: (-(total * sizes[k] % n), k))
    for k in by_remainder[: total - sum(rows)]:
        rows[k] += 1
    for k in range(len(sizes)):
        if sizes[k] > 0 and rows[k] == 0:
            donor = max(range(len(sizes)), key=lambda j: (rows[j], -j))
            rows[donor] -= 1
            rows[k] = 1
    return tuple(rows)


# ---------------------------------------------------------------- the plan and the registry entry


@dataclasses.dataclass(frozen=True)
class DpcdaPlan(MixingPlan):
    """DP-CDA's plan: T_k rows per class (``class_rows``: how T was split), each the mean of l records of the class
    plus N(0, sigma_x^2 I), labels e_k plus N(0, sigma_y^2 I) (sigma_y free within a class)."""

    label_noise: float = 0.0  # sigma_y, the config's
    class_rows: str = "equal"  # the config's rule: 'equal' or 'proportional'
    records_public: int = 0  # N as seed 000's Theorem 1 takes it (public or the DP total)

    @property
    def sigma_y(self) -> float:
        return self.label_noise

    def paper_theorem(self, plan) -> dict:
        return dict(
            sigma_x=self.sigma_x,
            sigma_y=self.sigma_y,
            mixing_order=self.mixing_order,
            clip=plan.clip,
            num_records=self.records_public,
            num_samples=self.samples_total,
            delta=plan.accounting.delta,
        )

    def manifest_section(self, plan, *, chunk_rows):
        from dpcda.schemas.manifest import DpcdaMechanism

        return DpcdaMechanism(
            sampling=Dpcda.SAMPLING_WORDS[plan.mode],
            mixing_order=self.mixing_order,
            sigma_y=self.sigma_y,
            class_rows=self.class_rows,
            samples_per_class=self.samples_per_class[0] if len(set(self.samples_per_class)) == 1 else None,
            rows_per_class=list(self.samples_per_class),
            class_sizes=list(plan.public_class_sizes) if plan.public_class_sizes else None,
            class_sizes_dp=list(plan.dp_class_sizes) if plan.dp_class_sizes else None,
            sampling_rates=[float(q) for q in self.sampling_rates],
            chunk_rows=chunk_rows,
            postprocessing=self.postprocessing(),
            mixing_paths=list(self.mixing_paths),
            projection=self.projection(),
            **self.common(plan),
        )


class Dpcda(Mechanism):
    """Seed 000: each row averages l records of one class, plus Gaussian noise; T_k rows per class."""

    name = "dpcda"
    params = DpcdaParams
    grouping = Grouping.CLASS
    graph = "dpcda.transforms.synthesize:MixClasses"
    audit_game = "dpcda.evaluation.audit.games:ClassMixing"
    SAMPLING_WORDS = {
        "fixed": "exactly l distinct records of the class, uniformly without replacement",
        "poisson": "each record of the class independently with probability q_k = l / N_k_hat; sum divided by l",
    }

    def synthesis_events(self, mode, *, group_sizes, samples, mixing_order, clip, sigma_x, **_) -> list:
        """One MixingEvent per class; ``samples``: T_k of every class (a sequence) or one T_k for all."""
        l = mixing_order
        per_class = list(samples) if isinstance(samples, (list, tuple)) else [samples] * len(group_sizes)
        return [
            MixingEvent(mode, max(int(s), l), int(t), l, clip, sigma_x)
            for s, t in zip(group_sizes, per_class, strict=True)
        ]

    def plan(self, public: Public) -> DpcdaPlan:
        """sigma_x over EVERY class's event (parallel composition: the worst class sets it). With T_k equal across
        classes the smallest class is the worst (epsilon falls as N_k rises, a tested property), so its search alone
        sets sigma_x and the other classes pass the check; with T_k in proportion to N_k a larger class has more rows
        at a lower rate and no class is assumed worst (``privacy.calibration.calibrate_parallel``)."""
        params, mode, clip = public.params, public.mode, public.privacy.clip
        sizes = list(public.class_sizes)
        T_k, T_total = self.rows(
            public.samples,
            public.num_classes,
            given=params.samples is not None,
            where=public.core.data.source,
            mode=mode,
            sizes=sizes,
            class_rows=params.class_rows,
        )

        def events(sigma: float) -> list:
            return self.synthesis_events(
                mode, group_sizes=sizes, samples=T_k, mixing_order=params.mixing_order, clip=clip, sigma_x=sigma
            )

        sigma_x = noise_for(events, public.budget, public.privacy, clip, parallel_first=lambda e: e.class_size)
        return DpcdaPlan(
            **MixingPlan.fields(public, self.grouping, tuple(events(sigma_x)), sigma_x, T_total),
            samples_per_class=T_k,
            label_noise=float(params.sigma_y),  # seed 000's label noise, given by the user (free within a class)
            class_rows=params.class_rows,
            records_public=public.records_public,
        )

    def rows(
        self,
        total: int,
        num_classes: int,
        *,
        given: bool = True,
        where: str = "",
        mode: str = "fixed",
        sizes=None,
        class_rows: str = "equal",
    ) -> tuple[tuple[int, ...], int]:
        """(T_k for each class, rows in all) for T rows (``given``: the config's ``samples``; else its default, the
        input's row count, which a refusal names by ``where`` and never prints: in poisson mode it is a DP estimate).
        ``sizes``: the public class sizes (fixed: N_k; poisson: the DP histogram's), for ``class_rows``
        proportional."""
        # T's default is the input's row count (a DP estimate in poisson mode): never printed
        count = "the DP estimate of the input's row count" if mode == "poisson" else "the input's row count"
        what = f"samples: T={total}" if given else f"{where}: T defaults to {count} (samples unset), which"
        if class_rows == "proportional":
            per_class = proportional_rows(total, sizes)
            if per_class is None:
                kind = "DP class sizes" if mode == "poisson" else "class sizes"
                # K is public; the number of non-empty classes comes from the sizes (DP in poisson mode): not printed
                raise PlanError(
                    f"{what} cannot give every non-empty class a row in proportion to its size ({kind}); pass "
                    f"--samples >= {num_classes}"
                    if any(int(n) > 0 for n in sizes)
                    else f"{where}: every {kind[:-1]} is 0: no class to make rows for"
                )
            return per_class, total
        per_class = total // num_classes
        if per_class < 1:
            raise PlanError(
                f"{what} gives no rows for {num_classes} classes (T_k = floor(T/K) = 0); pass --samples >= "
                f"{num_classes}"
            )
        return (per_class,) * num_classes, per_class * num_classes

    def label_caveat(self) -> str:
        return "Label noise (sigma_y) costs no privacy here: within a class the one-hot mean is always e_k."

    def synthesize(self, ctx: InProcess):
        plan, chunk_rows, soft_labels = ctx.plan, ctx.core.execution.chunk_rows, ctx.core.postprocess.soft_labels
        mix: DpcdaPlan = plan.synthesis
        for k in range(plan.num_classes):
            for _, f, lab in mix_class(
                ctx.normalized(ctx.x[ctx.y == k]),
                key=ctx.key,
                class_index=k,
                num_classes=plan.num_classes,
                mode=plan.mode,
                mixing_order=mix.mixing_order,
                sigma_x=mix.sigma_x,
                samples=mix.samples_per_class[k],
                chunk_rows=chunk_rows,
                sampling_rate=mix.sampling_rates[k],
                device=ctx.device,
                sigma_y=mix.sigma_y,
                lowpass=mix.lowpass,
                denoise=mix.denoise_spec,
                soft_labels=soft_labels,
                basis=ctx.basis,
                clip=plan.clip,
            ):
                yield (f, lab.argmax(axis=1), lab) if soft_labels else (f, lab, None)
