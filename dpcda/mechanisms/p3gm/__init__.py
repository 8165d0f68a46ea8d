"""P3GM (seed 004, Algorithm 1): a DP mixture prior on a DP-PCA projection, a VAE trained with DP-SGD, sampled rows.

Relation: add or remove one record, label included (``poisson``). The rows reach this module z-scored and clipped to
L2 norm ``clip (1 - CLIP_MARGIN)``; the DP-PCA basis V (d x d', orthonormal columns) is already DP (its own event,
``mechanisms.dppca``). What it fits, what each step spends, and what is post-processing:

1. Projection (post-processing of V): xhat_i = V^T x_i / clip (``project_rows``), so ||xhat_i|| <= 1 - CLIP_MARGIN.
2. DP-EM (``fit_prior``; ``privacy.events.IteratedGaussianEvent`` with ``sensitivity = em_sensitivity() = sqrt(3)``):
   a mixture of ``components`` diagonal Gaussians on xhat. The start is public and data-independent (equal weights,
   unit-ball-scaled means from the public stream ``public_key("p3gm-em-init", 0)``, per-coordinate variances 1/d').
   Each iteration's E-step uses only the previous (DP) parameters, so record i's responsibilities r_i >= 0,
   sum_k r_ik = 1, depend on x_i alone. Three blocks of sums are released with N(0, sigma_e^2) on every coordinate
   (stream ("p3gm-em", iteration)): S0 = sum_i r_i (K), S1 = sum_i r_i xhat_i^T (K x d'), S2 = sum_i r_i (xhat_i^2)^T
   (K x d', squares elementwise). One record moves S0 by ||r_i|| <= 1, S1 by ||r_i|| ||xhat_i|| <= 1 and S2 by
   ||r_i|| ||xhat_i^2|| <= ||xhat_i||^2 <= 1: L2 sensitivity sqrt(3) for the whole vector, ``em_iterations`` adaptive
   Gaussian releases. The M-step is post-processing (floored counts and weights, means kept in the unit ball,
   variances in [VAR_FLOOR, 1]).
3. DP-SGD (``train_vae``; ``privacy.events.DpSgdEvent(sampling_rate, steps, noise_multiplier)``): the encoder's mean is
   FIXED to the projection (P3GM's point: the latent mean is sqrt(d') xhat_i); the encoder [d, encoder_hidden, d']
   (ReLU; the width defaults to hidden) outputs only the log-variance; the decoder [d', hidden, d + K] (ReLU) outputs
   the feature means (unit-variance Gaussian likelihood on the rows scaled by sqrt(d) / clip, so coordinates are about
   unit size: a public rescaling) and K label logits (cross-entropy with y, weighted ``label_weight_for``). The KL term
   is the single-sample Monte Carlo estimate log q(z|x) - log p_MoG(z) at the reparametrised z = mu + sigma eps. Per
   step t: the Poisson batch (``mechanisms.dpsgd.poisson_batch``, stream ("p3gm-batch", t)); eps from ("p3gm-eps", t)
   (given the batch, its records' eps are iid N(0, I) whatever their order, so each record's gradient is a function of
   that record and of randomness independent of the data, as the DP-SGD analysis allows); per-example gradients of ALL
   parameters, clipped to ``grad_clip`` (``clip_factors``) and summed in float64; N(0, (z C)^2) on every coordinate
   (``noisy_sum``, stream ("p3gm-sgd", t)); an empty batch still gets its noise. Dividing by the public
   ``expected_batch`` and Adam's step are post-processing. The start is public (PyTorch's default init drawn from the
   public stream ``public_key("p3gm-init", 0)``), and by default (``decoder_start`` "pca") the decoder's feature output
   starts as the DP-PCA reconstruction V V^T x (``pca_decoder``: a function of V, post-processing).
4. Sampling (``sample_rows``, post-processing of the DP prior and decoder): component by exact inversion of 53-bit
   uniforms, z from that Gaussian, features = the decoder's feature means mapped back to the rows' units and clipped
   to norm ``clip``, label = argmax of the label logits; stream ("p3gm-sample", chunk), so a retried bundle redraws
   the same rows.

Per-example gradients without per-example passes (ghost clipping, exact for Linear layers): for a Linear layer with
input a_i and output gradient g_i, example i's weight gradient is g_i a_i^T (Frobenius norm ||g_i|| ||a_i||) and its
bias gradient g_i. One backward of the summed loss to the pre-activations gives every g_i (no example's loss depends
on another's pre-activations: no batch statistics anywhere); the squared norms sum_l ||g_il||^2 (||a_il||^2 + 1)
and the clipped sums (f G)^T A are computed in float64 from the float32 G and A. The squared norms are sums in a fixed
order made of elementwise operations only (``row_square_sums``), so a row's norm has the same bits at any position of
its block on any IEEE device, where a reduction kernel's order can depend on the row's place in memory.

Floats. EM: each record's contribution (r', r' xhat, r' xhat^2), r' = r (1 - CLIP_MARGIN), is computed in float64,
truncated toward zero to multiples of 2^-EM_QUANTUM_BITS (never growing any block's norm: each stays below 1 in the
bits), then summed as exact int64; the sums (< 2^53 quanta for fewer than ``MAX_EM_ROWS`` rows) are exact float64
centres for ``NoiseStream.gaussian``. DP-SGD: products of float32 values are exact in float64, the float64 norms are
within a relative d 2^-52 of the exact ones (pairwise sums: far closer), and the margin CLIP_MARGIN in ``clip_factors``
absorbs that and the float64 summation of the batch (``mechanisms.dpsgd``). That one row's float32 forward and backward
do not depend on which other rows share its batch is made true rather than assumed (``mechanisms.rowwise``): the
projection, the EM contributions and the DP-SGD passes run on zero-padded blocks of fixed shapes (SGD_BLOCK rows; Linear
widths padded to multiples of ``rowwise.WIDTH_MULTIPLE`` on the CPU, and on a GPU the Linear products summed in an order
fixed by the width alone, ``rowwise.fixed_order_matmul``; the projection on one BLAS thread), and the position of a row
in its block is checked not to matter (``check_shapes`` before any row is read, ``check_sgd_block`` and the cached
checks again in the fit).

Randomness. Nothing here calls torch's or numpy's generators: every draw touching private data is a
``privacy.noise.NoiseStream`` under the run key; the weight initialisation and the EM start are public draws
(``public_key``), the same in every run. The noise draws that carry privacy are one per parameter per DP-SGD step and
K (1 + 2 d') per EM iteration (what the plan counts for the sampler's delta). The loss handed to ``progress`` is
computed from private rows and is NOT DP: it is for logs that only those who may see the rows read.

Modules: ``spec`` (settings, types, shapes), ``em`` (DP-EM), ``vae`` (the network), ``training`` (DP-SGD),
``sample`` (the fit and sampling), ``mechanism`` (the plan and the registry entry).
"""

from __future__ import annotations

from dpcda.mechanisms.p3gm.em import (  # noqa: F401
    _check_em,
    _em_contributions,
    _into_ball,
    _log_responsibilities,
    em_statistics,
    fit_prior,
    m_step,
    public_start,
)
from dpcda.mechanisms.p3gm.mechanism import (  # noqa: F401
    P3gm,
    P3gmPlan,
    p3gm_parameters,
)
from dpcda.mechanisms.p3gm.sample import (  # noqa: F401
    QUOTA_ROUNDS,
    check_shapes,
    class_quota,
    decode,
    fit,
    sample_chunks,
    sample_latent,
    sample_rows,
    spec_from_plan,
)
from dpcda.mechanisms.p3gm.spec import (  # noqa: F401
    _LOG_2PI,
    EM_BLOCK_ROWS,
    EM_QUANTUM_BITS,
    LOGVAR_RANGE,
    MAX_EM_ROWS,
    PARAM_NAMES,
    PROGRESS_EVERY,
    SGD_BLOCK,
    SGD_ROW_CHECK,
    VAR_FLOOR,
    WEIGHT_FLOOR,
    MogPrior,
    P3gmModel,
    P3gmSpec,
    em_sensitivity,
)
from dpcda.mechanisms.p3gm.training import (  # noqa: F401
    _CHECKED_SGD,
    _THREADS_LOCK,
    _block_terms,
    _new_threads_lock,
    _sgd_steps,
    _torch_threads,
    check_sgd_block,
    ghost_clipped_sum,
    row_square_sums,
    sgd_threads,
    train_vae,
)
from dpcda.mechanisms.p3gm.vae import (  # noqa: F401
    _prior_tensors,
    _shapes,
    feature_scale,
    init_state,
    label_weight_for,
    latent_scale,
    mog_log_density,
    pca_decoder,
    per_example_loss,
)
