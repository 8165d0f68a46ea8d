"""The ``Mechanism`` interface: what the release, the planner, the manifest and the audit ask of a mechanism.

One subclass per mechanism, in the mechanism's own module (``mechanisms.dpcda``, ``dpmix``, ``local``, ``randproj``,
``p3gm``); ``mechanisms.registry`` lists them. Nothing outside those modules compares a mechanism's name: it looks
the mechanism up and asks. A mechanism says

- its traits: the modes it offers, how its rows are grouped (per class, the whole dataset, or one row per record),
  whether rows mix records (the join path), whether it always releases label scores;
- its DP events for given public group sizes and feature noise (``synthesis_events``), the shares of the budget it
  spends besides the release's statistics (``budget_shares``), and how its noise is calibrated to what the budget
  planner (``privacy.budget``) leaves (``calibrate``);
- its Beam-free synthesis (``synthesize``, the in-process loop) and its PTransform (``graph``, a ``module:Class``
  that the pipeline resolves: mechanisms stay below the Beam layer);
- its manifest section and caveats, and what the evaluation rebuilds from a manifest (``test_projection``).
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, Callable, ClassVar, Iterator, Optional

import numpy as np

from dpcda.privacy.accounting import relation_key
from dpcda.privacy.budget import BudgetPlan, Share, calibrate_synthesis
from dpcda.privacy.errors import DpcdaError
from dpcda.schemas.mechanism_params import MechanismParams
from dpcda.schemas.settings import CoreSettings, PrivacyParams

FIXED_CLASS_SIZES_CAVEAT = (
    "fixed mode: class sizes N_k are public and stated here; the guarantee covers replacing one record's features "
    "within its class."
)


class PlanError(DpcdaError, ValueError):
    """The data and config cannot make a release (e.g. a class smaller than l in fixed mode)."""


@dataclasses.dataclass(frozen=True)
class Calibrated:
    """The noise a mechanism's synthesis draws and the events it spends (what ``Mechanism.calibrate`` returns)."""

    sigma_x: float
    per_group: tuple  # the synthesis' events, one per group (parallel composition)
    p3gm: Any = None  # mechanisms.plan.P3gmPlan
    marginals: Any = None  # mechanisms.marginals.plan.MarginalsPlan


class Mechanism(abc.ABC):
    """One mechanism of the product. Subclasses set the class attributes and override what differs."""

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    modes: ClassVar[tuple[str, ...]] = ("fixed", "poisson")
    groups: ClassVar[str] = "class"  # 'class': rows made per class; 'dataset': one group; 'record': a row per record
    mixes: ClassVar[bool] = False  # rows average records (l > 1): the join path, the per-group memory check
    label_scores: ClassVar[bool] = False  # always releases the K label scores beside the hard label
    graph: ClassVar[str] = ""  # "module:PTransform" of its Beam synthesis
    audit_game: ClassVar[str] = ""  # the canary game evaluation.audit plays on it (mixing, perturbation, DP-SGD)
    one_worker: ClassVar[str] = ""  # why the whole dataset must fit one worker ('' when it need not)
    fixed_caveat: ClassVar[str] = FIXED_CLASS_SIZES_CAVEAT
    projects: ClassVar[bool] = False  # every record is mapped by a public matrix (its norm is in the sensitivity)
    fits_model: ClassVar[bool] = False  # rows are sampled from a DP-fitted model (no noise on the rows themselves)
    paper_theorem: ClassVar[bool] = False  # seed 000's Theorem 1 (evaluation.paper) is stated beside the guarantee
    # how its events compose, in the manifest's privacy.composition
    composition: ClassVar[str] = (
        "parallel over classes (a record meets only its own class's rows); sequential with the statistics releases"
    )
    normalizes: ClassVar[bool] = True  # its rows are z-scored (False: no statistics are computed or spent)
    # poisson mode: a DP class histogram chooses its rows per class (False: no histogram is drawn or spent; marginals
    # takes its row count from its fitted model's total, post-processing of its own noisy counts)
    class_histogram: ClassVar[bool] = True
    accountant: ClassVar[str] = ""  # the accountant of its events where not the mode's ('rdp': zCDP events)

    # ---------------------------------------------------------------- privacy

    def relation(self, mode: str) -> str:
        """The key of ``privacy.accounting.RELATION_WORDS`` for this mechanism in ``mode``."""
        return relation_key(self.name, mode)

    @abc.abstractmethod
    def synthesis_events(
        self,
        mode: str,
        *,
        group_sizes,
        samples: int,
        mixing_order: int,
        clip: float,
        sigma_x: float,
        label_noise_ratio: Optional[float] = None,
        gain: float = 1.0,
    ) -> list:
        """The events the synthesis spends at feature noise ``sigma_x``, one per group (parallel composition)."""

    def budget_shares(self, privacy: PrivacyParams, params: MechanismParams) -> list[Share]:
        """Shares of the budget this mechanism spends beyond the release's statistics (``mechanisms.plan``), each
        calibrated alone by the planner and composed with the synthesis (p3gm: DP-EM)."""
        return []

    def calibrate(
        self, events: Callable[[float], list], budget: BudgetPlan, *, privacy: PrivacyParams, clip: float, **_
    ) -> Calibrated:
        """sigma_x (the config's, or calibrated so that the synthesis composes to what the planner left) and its
        events."""
        if privacy.sigma_x is not None:
            sigma_x = float(privacy.sigma_x)
        else:
            # the events compose in sequence (a mechanism whose groups compose in parallel overrides calibrate: DP-CDA)
            sigma_x = calibrate_synthesis(budget, events, scale=clip)
        return Calibrated(sigma_x=sigma_x, per_group=tuple(events(sigma_x)))

    def label_noise_ratio(self, params: MechanismParams) -> Optional[float]:
        return None

    def sigma_y(self, params: MechanismParams, sigma_x: float) -> float:
        """The label noise std (0: the config refuses sigma_y for every mechanism but DP-CDA)."""
        return 0.0

    def projection(self, params: MechanismParams, dim: int) -> tuple[Optional[tuple[int, int, float]], float]:
        """((p, public seed, gain), gain) of a public projection of every record (gain an upper bound on ||R||_2,
        ``privacy.events.projection_gain``), or (None, 1.0)."""
        return None, 1.0

    def extra_draws(self, calibrated: Calibrated, *, dim: int, num_classes: int) -> int:
        """Gaussian draws carrying privacy noise beyond the rows' (p3gm's DP-SGD and DP-EM)."""
        return 0

    def check_before_work(self, core: CoreSettings, dim: int) -> None:
        """Checks that need the input's width, run by the launcher before any row is read (PlanError and kin)."""

    # ---------------------------------------------------------------- rows

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
        proportional. Mechanisms that do not make rows per class: ((), T)."""
        return (), total

    def group_records(self, plan, g: int) -> int:
        """Exact records of group g (private: the join path's index range)."""
        return int(sum(plan.class_rows)) if self.groups == "dataset" else int(plan.class_rows[g])

    def group_samples(self, plan, g: int) -> int:
        return plan.samples_total if self.groups == "dataset" else plan.samples_per_class[g]

    def output_dim(self, params: MechanismParams, dim: int) -> int:
        return dim

    @abc.abstractmethod
    def synthesize(self, ctx: "InProcess") -> Iterator[tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]]:
        """(features, hard labels, label scores or None) chunks of an in-process release (``mechanisms.inprocess``)."""

    # ---------------------------------------------------------------- manifest and evaluation

    @abc.abstractmethod
    def label_caveat(self) -> str:
        """The manifest's second caveat: what the released labels and sizes are, in words."""

    @abc.abstractmethod
    def manifest_section(self, plan, *, chunk_rows: int, common: dict, postprocessing, projection):
        """The manifest's ``mechanism`` model (``schemas.manifest``)."""

    def test_projection(self, manifest: dict) -> Optional[np.ndarray]:
        """The public map the evaluation applies to real test rows after the z-score (randproj's R), or None."""
        return None


@dataclasses.dataclass
class InProcess:
    """What an in-process synthesis gets: the data, the plan, and the shared pieces (``mechanisms.inprocess``);
    ``core``: the release's privacy and mechanism parameters and execution settings, never the whole config."""

    x: np.ndarray
    y: np.ndarray
    plan: Any
    core: CoreSettings
    key: bytes
    normalized: Callable[[np.ndarray], np.ndarray]
    basis: Optional[np.ndarray]
    device: Any
    progress: Optional[Callable] = None
    on_model: Optional[Callable] = None
    stated_plan: Any = None  # set by a synthesis that completes the plan with its DP choices (marginals' picks)
