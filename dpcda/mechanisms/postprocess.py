"""Post-processing of released rows: public, data-independent maps applied to the DP output only.

None of them changes a privacy number (post-processing); the manifest records which ran.

Low-pass (``--lowpass K``): every finished noisy row is projected onto the span of its low-frequency 2-D DCT basis
images (frequencies u + v < K on the feature image's (H, W) grid, per channel). The projection is fixed before any
data is seen. It keeps most of an image's energy and removes the noise outside the kept subspace (on Fashion-MNIST,
K = 16 keeps 136 of 784 coefficients).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional, Sequence

import numpy as np
import torch

from dpcda.mechanisms.base import PlanError
from dpcda.schemas.settings import PostprocessParams


def dct_matrix(n: int) -> np.ndarray:
    """Orthonormal DCT-II matrix (n, n): row u is the u-th cosine basis vector."""
    i = np.arange(n)
    c = np.cos(np.pi * (2 * i[None, :] + 1) * i[:, None] / (2 * n)) * np.sqrt(2.0 / n)
    c[0] /= np.sqrt(2.0)
    return c


def lowpass_kept(image_shape: Sequence[int], k: int) -> tuple[tuple[int, int, int], int]:
    """((C, H, W), coefficients kept) for a low-pass with frequencies u + v < k; checks both arguments."""
    shape = tuple(int(s) for s in image_shape)
    if len(shape) == 2:
        shape = (1, *shape)
    if len(shape) != 3 or min(shape) < 1:
        raise ValueError(f"image_shape must be (H, W) or (C, H, W), got {image_shape}")
    if k < 1:
        raise ValueError(f"lowpass K must be >= 1, got {k}")
    _, h, w = shape
    return shape, shape[0] * sum(1 for u in range(h) for v in range(w) if u + v < k)


def lowpass_basis(image_shape: Sequence[int], k: int) -> np.ndarray:
    """(kept, d) orthonormal rows spanning the 2-D DCT images with u + v < k, per channel.

    ``image_shape`` is (H, W) or (C, H, W) with d = prod(image_shape), features in C-major (channels-first)
    order. ``rows @ B.T @ B`` is then the orthogonal projection of each row onto the low frequencies.
    """
    shape, _ = lowpass_kept(image_shape, k)
    ch, h, w = shape
    ch_h, ch_w = dct_matrix(h), dct_matrix(w)
    freqs = [(u, v) for u in range(h) for v in range(w) if u + v < k]
    plane = np.stack([np.outer(ch_h[u], ch_w[v]).ravel() for u, v in freqs])  # (kept per channel, H*W)
    basis = np.zeros((ch * len(freqs), ch * h * w))
    for c in range(ch):
        basis[c * len(freqs) : (c + 1) * len(freqs), c * h * w : (c + 1) * h * w] = plane
    return basis.astype(np.float32)


class LowPass:
    """The projection of ``lowpass_basis`` applied separably: DCT along H and W, keep u + v < k, inverse DCT.

    O(rows * C * H * W * (H + W)) work and no (kept, d) matrix, so it scales to large images.
    """

    def __init__(self, image_shape: Sequence[int], k: int, device):
        shape, _ = lowpass_kept(image_shape, k)
        self.shape, self.dim = shape, int(np.prod(shape))
        _, h, w = shape
        self.ch = torch.from_numpy(dct_matrix(h).astype(np.float32)).to(device)
        self.cw = torch.from_numpy(dct_matrix(w).astype(np.float32)).to(device)
        u, v = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
        self.mask = torch.from_numpy(((u + v) < k).astype(np.float32)).to(device)

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        x = rows.reshape(rows.shape[0], *self.shape)
        coef = self.ch @ x @ self.cw.T * self.mask
        return (self.ch.T @ coef @ self.cw).reshape(rows.shape[0], self.dim)


def gaussian_blur_matrix(n: int, sigma: float) -> np.ndarray:
    """(n, n) rows of a Gaussian kernel of std ``sigma`` (pixels), truncated at 3 sigma and at the image's edge, each
    row summing to one."""
    i = np.arange(n)
    w = np.exp(-0.5 * ((i[None, :] - i[:, None]) / sigma) ** 2)
    w[np.abs(i[None, :] - i[:, None]) > max(1, int(np.ceil(3 * sigma)))] = 0.0
    return w / w.sum(axis=1, keepdims=True)


class Blur:
    """Seed 001's denoising: a Gaussian blur of every released image row, separable along H and W, per channel."""

    def __init__(self, image_shape: Sequence[int], sigma: float, device):
        shape = tuple(int(s) for s in image_shape)
        self.shape = (1, *shape) if len(shape) == 2 else shape
        self.dim = int(np.prod(self.shape))
        _, h, w = self.shape
        self.gh = torch.from_numpy(gaussian_blur_matrix(h, sigma).astype(np.float32)).to(device)
        self.gw = torch.from_numpy(gaussian_blur_matrix(w, sigma).astype(np.float32)).to(device)

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        x = rows.reshape(rows.shape[0], *self.shape)
        return (self.gh @ x @ self.gw.T).reshape(rows.shape[0], self.dim)


def make_postprocess(*, lowpass=None, denoise=None, device="cpu"):
    """A function float32 rows (numpy) -> float32 rows applying the release's post-processing, or None.

    ``lowpass``: (image_shape, K); ``denoise``: (image_shape, sigma). Blur first, then the low-pass.
    """
    steps = []
    if denoise is not None:
        steps.append(Blur(denoise[0], denoise[1], device))
    if lowpass is not None:
        steps.append(LowPass(lowpass[0], lowpass[1], device))
    if not steps:
        return None
    dev = torch.device(device) if not isinstance(device, torch.device) else device

    def run(rows: np.ndarray) -> np.ndarray:
        t = torch.from_numpy(np.ascontiguousarray(rows, np.float32)).to(dev)
        for step in steps:
            if step.dim != t.shape[1]:
                raise ValueError(
                    f"post-processing image shape {tuple(step.shape)} has {step.dim} features, rows have {t.shape[1]}"
                )
            t = step(t)
        return t.cpu().numpy()

    return run


@dataclasses.dataclass(frozen=True)
class ImagePost:
    """The post-processing a release asked for, resolved against its feature dimension d: a low-pass
    ((image_shape, K)) and/or a blur of std ``denoise`` pixels on ``image_shape`` (None: a square)."""

    dim: int
    lowpass: Optional[tuple[tuple[int, ...], int]] = None
    denoise: Optional[float] = None
    image_shape: Optional[tuple[int, ...]] = None  # of the rows, for the blur

    @property
    def denoise_spec(self) -> Optional[tuple[tuple[int, ...], float]]:
        """(image_shape, sigma) for the blur, or None."""
        if self.denoise is None:
            return None
        shape = self.image_shape or (math.isqrt(self.dim),) * 2
        return shape, self.denoise

    def make(self, device="cpu"):
        """``make_postprocess`` of these steps."""
        return make_postprocess(lowpass=self.lowpass, denoise=self.denoise_spec, device=device)

    def section(self):
        """The manifest's ``postprocessing`` (``schemas.manifest.PostProcessing``)."""
        from dpcda.schemas.manifest import PostProcessing

        shape = self.lowpass[0] if self.lowpass else self.denoise_spec[0]
        k = self.lowpass[1] if self.lowpass else None
        return PostProcessing(
            lowpass=k,
            denoise=self.denoise,
            image_shape=list(shape),
            kept_coefficients=lowpass_kept(shape, k)[1] if k else None,
        )


def resolve_image_shape(post: PostprocessParams, dim: int) -> tuple[int, ...]:
    """The rows' image grid for post-processing: --image-shape (checked against d), else a square."""
    if post.image_shape is not None:
        shape = tuple(post.image_shape)
        if math.prod(shape) != dim:
            raise PlanError(
                f"image_shape: {','.join(map(str, shape))} has {math.prod(shape)} features, the input has d={dim}"
            )
        return shape
    side = math.isqrt(dim)
    if side * side != dim:
        raise PlanError(f"lowpass/denoise: d={dim} is not a square image; give --image-shape H,W or C,H,W")
    return (side, side)


def resolve_lowpass(post: PostprocessParams, dim: int) -> Optional[tuple[tuple[int, ...], int]]:
    """(image_shape, K) for the low-pass post-processing, checked against the feature dimension d."""
    if post.lowpass is None:
        return None
    shape = resolve_image_shape(post, dim)
    h, w = shape[-2:]
    if post.lowpass >= h + w - 1:
        raise PlanError(
            f"lowpass: K={post.lowpass} keeps every DCT coefficient of a {h}x{w} image (u + v <= "
            f"{h + w - 2}); use K < {h + w - 1} or leave --lowpass out"
        )
    return shape, int(post.lowpass)


def resolve(post: PostprocessParams, dim: int) -> Optional[ImagePost]:
    """The release's post-processing for rows of width ``dim``, checked (PlanError), or None when none is asked."""
    lowpass = resolve_lowpass(post, dim)
    if lowpass is None and post.denoise is None:
        return None
    shape = resolve_image_shape(post, dim) if post.denoise else None
    return ImagePost(dim=dim, lowpass=lowpass, denoise=post.denoise, image_shape=shape)
