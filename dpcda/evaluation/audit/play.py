"""Playing a canary game on a small configuration (``run_audit``), on a release's manifest (``audit_section``), and
against a deliberately broken claim (``run_paper_rate_audit``)."""

from __future__ import annotations

import math
import time
from typing import Optional

from dpcda.evaluation.audit.games import Game, Setting
from dpcda.evaluation.audit.statistics import AuditError, score_game
from dpcda.mechanisms import registry
from dpcda.mechanisms.base import resolve
from dpcda.mechanisms.device import pick_device
from dpcda.privacy.accounting import RELATION_WORDS, ReleaseEvents, account
from dpcda.privacy.budget import BudgetPlan
from dpcda.privacy.calibration import calibrate_sigma_x
from dpcda.privacy.events import MODES
from dpcda.privacy.noise import key_from_test_seed
from dpcda.progress import track
from dpcda.schemas.config import AUDIT_MAX_TRIALS

DEFAULT_DIM = 8
AUDIT_NOTE = (
    "empirical audit of the mixing mechanism with this release's mode, l, c and sigma_x on a "
    "small synthetic class with a canary record, not on the released data; accounted_epsilon is "
    "that small class's epsilon (above the release's, whose classes are larger). The bound is a "
    "95%-confidence lower bound on it, which can expose optimistic accounting but never "
    "certifies privacy"
)


def game_of(mechanism: str) -> Game:
    """The canary game the mechanism names (``Mechanism.audit_game``); AuditError where it names none."""
    try:
        entry = registry.get(mechanism)
    except registry.UnknownMechanism as err:
        raise AuditError(str(err)) from None
    if not entry.audit_game:
        raise AuditError(f"audit: no audit game is offered for {mechanism} yet")
    return resolve(entry.audit_game)()


def _plan(s: Setting, game: Game, *, epsilon, sigma_x, normalization):
    """The mechanism's plan of the game's configuration (``mechanisms.plan.plan_synthesis``, a release's planner on
    one group of ``class_size`` public records) and the budget it was planned in."""
    from dpcda.mechanisms.plan import plan_synthesis
    from dpcda.schemas.config import release_settings

    params = registry.get(s.mechanism).params
    own = {k: v for k, v in game.settings(s).items() if k in params.flat_names()}
    try:
        settings = release_settings(
            mechanism=s.mechanism,
            mode=s.mode,
            epsilon=epsilon,
            sigma_x=sigma_x,
            delta=s.delta,
            clip=s.clip,
            normalization=normalization,
            **own,
        )
    except ValueError as err:  # a parameter past a release's bound: no release has this plan to calibrate
        derived = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in own.items())
        raise AuditError(
            f"audit: {str(err).splitlines()[0]}; the game plans a {s.mechanism} release with {derived} (from "
            "--mixing-order, --class-size and --samples-per-class): lower them"
        ) from None
    synthesis, public, _ = plan_synthesis(settings.core, dim=s.dim, class_sizes=[s.class_size])
    return synthesis, public.budget


def run_audit(
    *,
    mode: str,
    mixing_order: int,
    epsilon: Optional[float] = None,
    sigma_x: Optional[float] = None,
    delta: float = 1e-5,
    class_size: int = 20,
    samples_per_class: int = 1,
    dim: int = DEFAULT_DIM,
    clip: float = 1.0,
    trials: int = 2000,
    seed: int = 0,
    device: str = "auto",
    claimed_epsilon: Optional[float] = None,
    mechanism: str = "dpcda",
    label_noise_ratio: float = 1.0,
    projection_dim: int = 4,
    normalization: Optional[str] = None,
) -> dict:
    """Audit one small configuration; ``trials`` mechanism runs on each of D and D'.

    Every mechanism plays the game it names (``evaluation.audit.games``) on its own synthesis code. Give ``epsilon``
    (the noise is the one the mechanism's plan calibrates, for one class of ``class_size`` public records: after the
    shares of the budget a release with these settings spends first, by the release's planner; ``normalization`` as
    the release's, default dp) or ``sigma_x`` (p3gm: its noise multiplier). ``claimed_epsilon`` is what the bound is
    checked against; it defaults to the epsilon ``privacy.accounting`` gives this configuration's synthesis.
    ``violation`` is true when the 95 % lower bound exceeds the claim: the claim is then wrong (a false alarm has
    probability <= 5 %).
    """
    t0 = time.time()
    if mode not in MODES:
        raise AuditError(f"mode: expected one of {MODES}, got {mode!r}")
    if mixing_order < 1:
        raise AuditError(f"mixing_order must be >= 1, got {mixing_order}")
    if class_size < max(2, mixing_order if mode == "fixed" else 2):
        raise AuditError(
            f"class_size {class_size} too small: the audit needs at least 2 records and, "
            f"in fixed mode, at least l = {mixing_order}"
        )
    if samples_per_class < 1 or trials < 4 or dim < 2 or clip <= 0:
        raise AuditError("samples_per_class >= 1, trials >= 4, dim >= 2 and clip > 0 are required")
    if trials > AUDIT_MAX_TRIALS:  # the game holds every trial's projections: time and memory grow with the count
        raise AuditError(f"trials must be at most {AUDIT_MAX_TRIALS:,}, got {trials:,}")
    if trials * samples_per_class > AUDIT_MAX_TRIALS * 16:  # (trials, samples) float64 per dataset: at most 128 MB
        raise AuditError(
            f"trials x samples_per_class must be at most {AUDIT_MAX_TRIALS * 16:,}, got {trials * samples_per_class:,}"
        )
    if (epsilon is None) == (sigma_x is None):
        raise AuditError("give exactly one of epsilon or sigma_x")
    game = game_of(mechanism)
    entry = registry.get(mechanism)
    try:
        entry.params.check_mode(mode)
    except ValueError as err:
        raise AuditError(str(err)) from None
    if sigma_x is not None and sigma_x < 0:
        raise AuditError(f"sigma_x must be >= 0, got {sigma_x}")
    s = Setting(
        mechanism=mechanism,
        mode=mode,
        mixing_order=mixing_order,
        class_size=class_size,
        samples_per_class=samples_per_class,
        dim=dim,
        clip=clip,
        delta=delta,
        trials=trials,
        seed=seed,
        label_noise_ratio=label_noise_ratio,
        projection_dim=projection_dim,
    )
    game.check(s)
    synthesis = budget = None
    if game.plans(sigma_x):
        synthesis, budget = _plan(s, game, epsilon=epsilon, sigma_x=sigma_x, normalization=normalization)
    noise, event = game.noise(s, synthesis, sigma_x)
    accounted = account(ReleaseEvents(mode, (), (event,)), delta, cross_check=False).epsilon
    claimed = accounted if claimed_epsilon is None else float(claimed_epsilon)
    dev = pick_device(device)
    with track(f"audit {mechanism} trials on D and D'", 2 * trials, unit="trials") as bar:
        scores = game.scores(s, synthesis, noise, event, key_from_test_seed(seed), dev, bar)
    half = trials // 2
    verdict = score_game(scores, half, delta)
    fields = game.fields(s, noise, event)
    fields.setdefault("neighbouring_relation", RELATION_WORDS[entry.relation(mode)])
    return {
        **fields,
        "target_epsilon": epsilon,
        **_planned_fields(budget if epsilon is not None else None),
        "accounted_epsilon": accounted,
        "claimed_epsilon": claimed,
        **verdict,
        "violation": bool(verdict["empirical_epsilon_lower_bound"] > claimed),
        "statistic": "log-likelihood ratio" if noise > 0 else "largest projection on the canary",
        "trials": trials,
        "selection_trials": half,
        **game.extra(s, noise),
        "device": dev.type,
        "wall_seconds": time.time() - t0,
    }


def _planned_fields(planned: Optional[BudgetPlan]) -> dict:
    """What the budget planner set aside before the synthesis (the audit's game plays the synthesis alone, and its
    accounted epsilon is the synthesis' own)."""
    if planned is None:
        return {}
    return {
        "statistics_epsilon": {s.name: s.epsilon for s in planned.shares},
        "synthesis_epsilon": planned.synthesis_epsilon,
    }


def run_paper_rate_audit(
    *, mode: str, mixing_order: int, epsilon: float, num_classes: int = 10, class_size: Optional[int] = None, **kwargs
) -> dict:
    """A deliberately broken claim: epsilon accounted with the paper's rate p = l/N, N = K * N_k.

    sigma_x is calibrated for one 'class' of N records (as if rows sampled the whole dataset), then
    the real per-class mechanism (rate l/N_k) is audited against that claim.
    """
    class_size = mixing_order if class_size is None else class_size
    sigma = calibrate_sigma_x(
        mode,
        class_sizes=[num_classes * class_size],
        samples_per_class=kwargs.get("samples_per_class", 1),
        mixing_order=mixing_order,
        clip=kwargs.get("clip", 1.0),
        target_epsilon=epsilon,
        delta=kwargs.get("delta", 1e-5),
    )
    out = run_audit(
        mode=mode, mixing_order=mixing_order, sigma_x=sigma, class_size=class_size, claimed_epsilon=epsilon, **kwargs
    )
    out["broken_claim"] = (
        f"epsilon {epsilon} accounted with p = l/N, N = {num_classes} x {class_size} records, "
        f"while rows sample one class of {class_size}"
    )
    return out


def json_safe(value):
    """JSON has no infinity (the manifest's convention): non-finite floats become null."""
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def audit_section(
    manifest: dict, *, class_size: Optional[int] = None, trials: Optional[int] = None, seed: int = 0
) -> dict:
    """The ``audit`` section for a release's manifest: the game its mechanism names, played at the release's settings
    (``Game.from_manifest``: its mode, l, c and noise on a small class; its accounted epsilon is that small class's,
    above the release's, whose classes are larger)."""
    name = manifest["mechanism"].get("name", "dpcda")  # the manifest model's default: DP-CDA's section may leave it out
    game = game_of(name)
    dev = pick_device("auto")
    settings = game.from_manifest(manifest, class_size=class_size, trials=trials, device=dev)
    result = run_audit(**settings, seed=seed, device=dev.type, mechanism=name)
    result["note"] = AUDIT_NOTE
    if game.scope():
        result["scope"] = game.scope()
    return json_safe(result)
