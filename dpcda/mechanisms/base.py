"""The ``Mechanism`` interface: what the release, the planner, the manifest and the audit ask of a mechanism.

One subclass per mechanism, in the mechanism's own module or package (``mechanisms.dpcda``, ``dpmix``, ``local``,
``randproj``, ``p3gm``, ``marginals``); ``mechanisms.registry`` lists them. Nothing outside those modules compares a
mechanism's name: it looks the mechanism up and asks. A mechanism says

- its parameters (``params``: its model in ``schemas.mechanism_params``, which also holds the modes it offers), how
  its rows are grouped (``Grouping``), whether it always releases label scores;
- the shares of the budget it spends besides the release's statistics (``budget_shares``), and its own plan
  (``plan``: public facts in, a frozen ``SynthesisPlan`` out, holding its noise scales and DP events, its manifest
  section, its one-line summary and what ``dpcda account`` prints of it);
- its Beam-free synthesis (``synthesize``, the in-process loop) and its PTransform (``graph``, a ``module:Class``
  that the pipeline resolves: mechanisms stay below the Beam layer), and its canary game (``audit_game``, likewise a
  ``module:Class`` that ``evaluation.audit`` resolves);
- its caveats, and what the evaluation rebuilds from a manifest (``test_projection``).
"""

from __future__ import annotations

import abc
import dataclasses
import enum
import importlib
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
POISSON_ADAPTIVE_CAVEAT = (
    "poisson mode: q_k, T_k and sigma_x are chosen from the DP class histogram; the histogram is "
    "accounted alone at its own (epsilon, delta) share and the rest is calibrated to what remains, "
    "so the guarantee is the sum (adaptive composition)."
)


class PlanError(DpcdaError, ValueError):
    """The data and config cannot make a release (e.g. a class smaller than l in fixed mode)."""


class Grouping(enum.Enum):
    """How a mechanism's rows are grouped; its events are one per group, and groups compose in parallel."""

    CLASS = "class"  # rows made per class, from that class's records only
    DATASET = "dataset"  # one group: rows made from the whole dataset
    RECORD = "record"  # a row per record (one event stands for every record's)

    def sizes(self, class_sizes) -> list[int]:
        """The public group sizes the events take: each class's, else the dataset's."""
        sizes = [int(s) for s in class_sizes]
        return sizes if self is Grouping.CLASS else [sum(sizes)]

    def count(self, num_classes: int) -> int:
        """Groups a release has (the join path's group index range)."""
        return num_classes if self is Grouping.CLASS else 1

    def of(self, labels: np.ndarray) -> np.ndarray:
        """Each record's group: its class, or 0."""
        return labels if self is Grouping.CLASS else np.zeros_like(labels)

    def records(self, class_rows, g: int) -> int:
        """Exact records of group g (private: the join path's index range)."""
        return int(class_rows[g]) if self is Grouping.CLASS else int(sum(class_rows))


class CaveatCode(enum.Enum):
    """What a plan has to say about its release; ``pipeline.manifest.caveat_words`` words each one."""

    SECRET_KEY = "secret_key"  # noise from a fresh secret key
    SEED_KEY = "seed_key"  # noise from a key derived from a test seed
    LABELS = "labels"  # what the released labels and sizes are (the mechanism's words)
    REFERENCE_BUDGET = "reference_budget"  # sigma_x given: the statistics' shares are of the reference budget
    FIXED_CLASS_SIZES = "fixed_class_sizes"  # fixed mode: class sizes public (the mechanism's words)
    POISSON_ADAPTIVE = "poisson_adaptive"  # poisson mode: what the DP histogram chose (the mechanism's words)
    PUBLIC_NORMALIZATION = "public_normalization"  # the user's statistics, assumed public
    EXACT_NORMALIZATION = "exact_normalization"  # exact private statistics: not end-to-end DP
    NO_FEATURE_NOISE = "no_feature_noise"  # sigma_x = 0
    MODEL_WITHOUT_NOISE = "model_without_noise"  # a model fitted without noise or clipping
    REPLANNED = "replanned"  # a changed plan for diagnostics, not a release


@dataclasses.dataclass(frozen=True)
class Caveat:
    """One caveat of a plan: its code and the parameters its words need (the mechanism whose words or name it uses,
    the reference epsilon)."""

    code: CaveatCode
    mechanism: str = ""
    epsilon: Optional[float] = None


@dataclasses.dataclass(frozen=True)
class Public:
    """What a mechanism plans its synthesis from: its settings and public (or DP) facts, never a record.

    ``class_sizes``: the class sizes the mode may use (fixed: the exact N_k, public there; poisson: the DP
    histogram's; () where the mechanism draws no histogram, ``Mechanism.class_histogram``); ``records``: N as the
    events take it (fixed: the exact row count; poisson: the DP total; None without a histogram); ``samples``: the T
    asked for (the config's, else ``records``; None: the synthesis sets its rows, marginals' fitted model's total);
    ``records_public``: N as seed 000's Theorem 1 takes it; ``mixing_paths``: 'memory' or 'join' per group (a public
    choice); ``pca``: the DP-PCA stage (``mechanisms.dppca.PcaPlan``) when the parameters ask for one; ``post``: the
    image post-processing (``mechanisms.postprocess.ImagePost``) when asked."""

    core: CoreSettings
    budget: BudgetPlan
    num_classes: int
    dim: int
    class_sizes: tuple[int, ...]
    records: Optional[int]
    samples: Optional[int]
    records_public: int
    mixing_paths: tuple[str, ...] = ()
    pca: Any = None
    post: Any = None

    @property
    def privacy(self) -> PrivacyParams:
        return self.core.privacy

    @property
    def params(self) -> MechanismParams:
        return self.core.params

    @property
    def mode(self) -> str:
        return self.core.privacy.mode


class SynthesisPlan(abc.ABC):
    """A mechanism's own plan: a frozen dataclass in the mechanism's module with at least ``events`` (the synthesis'
    DP events, one per group: parallel composition) and ``samples_total`` (T, the rows released; None until the
    synthesis has run where it sets its own rows: marginals' fitted model's total), and the methods below. The generic
    ``mechanisms.plan.ReleasePlan`` holds it as ``synthesis``."""

    events: tuple
    samples_total: Optional[int]

    @abc.abstractmethod
    def summary(self) -> str:
        """The plan's noise in one log line of ``key=value`` words (``stage=calibrate``)."""

    @abc.abstractmethod
    def noise_stds(self) -> dict:
        """Name -> std of each Gaussian the synthesis draws with privacy (the manifest's noise grids; 0: none)."""

    @abc.abstractmethod
    def gaussian_draws(self, *, dim: int, num_classes: int) -> int:
        """Gaussian draws of the synthesis that carry privacy noise (for the sampler's delta)."""

    @abc.abstractmethod
    def manifest_section(self, plan, *, chunk_rows: int):
        """The manifest's ``mechanism`` model (``schemas.manifest``) of the release ``plan`` (a ``ReleasePlan``)."""

    @abc.abstractmethod
    def account_figures(self, clip: float) -> dict:
        """What ``dpcda account`` prints of this plan (the noise scales and the event's rate), in order; ``clip``: the
        release's c."""

    def caveats(self, epsilon: float, mechanism: str) -> tuple[Caveat, ...]:
        """Caveats of this plan's own (e.g. no noise); ``epsilon``: the accounted one."""
        return ()

    def noisy_measurements(self) -> Optional[dict]:
        """The DP measurements a quality report sets beside the released rows (post-processing of DP outputs, JSON;
        ``evaluation.quality`` reads them), once the synthesis has run; None where the mechanism measures none."""
        return None

    def dp_pca(self):
        """The DP-PCA stage (``mechanisms.dppca.PcaPlan``) this synthesis uses, or None."""
        return None

    def projection_matrix(self, dim: int) -> Optional[np.ndarray]:
        """The public map every record is multiplied by before its noise (randproj's R: the evaluation applies it to
        real test rows), or None."""
        return None

    def paper_theorem(self, plan) -> Optional[dict]:
        """The arguments of seed 000's Theorem 1 (``evaluation.paper.theorem1_epsilon``), stated beside the
        guarantee as an informational figure where it applies, else None."""
        return None


def resolve(ref: str) -> Any:
    """The object a ``module:name`` reference names (a mechanism's PTransform or audit game)."""
    module, name = ref.split(":")
    return getattr(importlib.import_module(module), name)


def noise_for(
    events: Callable[[float], list], budget: BudgetPlan, privacy: PrivacyParams, clip: float, parallel_first=None
) -> float:
    """sigma_x: the config's, or calibrated so that the synthesis' events (of groups in parallel where
    ``parallel_first`` orders them) compose to what the budget planner left (``privacy.budget.calibrate_synthesis``)."""
    if privacy.sigma_x is not None:
        return float(privacy.sigma_x)
    return calibrate_synthesis(budget, events, scale=clip, parallel_first=parallel_first)


class Mechanism(abc.ABC):
    """One mechanism of the product. Subclasses set the class attributes and override what differs."""

    name: ClassVar[str] = ""
    params: ClassVar[type[MechanismParams]] = MechanismParams  # its parameters and rules (modes, mixing)
    grouping: ClassVar[Grouping] = Grouping.CLASS
    label_scores: ClassVar[bool] = False  # always releases the K label scores beside the hard label
    graph: ClassVar[str] = ""  # "module:PTransform" of its Beam synthesis
    audit_game: ClassVar[str] = ""  # "module:Game" of the canary game evaluation.audit plays on it ('' when none)
    one_worker: ClassVar[str] = ""  # why the whole dataset must fit one worker ('' when it need not)
    fixed_caveat: ClassVar[str] = FIXED_CLASS_SIZES_CAVEAT
    adaptive_caveat: ClassVar[str] = POISSON_ADAPTIVE_CAVEAT  # what the DP histogram chose ('': nothing to say)
    fits_model: ClassVar[bool] = False  # rows are sampled from a DP-fitted model (no noise on the rows themselves)
    # how its events compose, in the manifest's privacy.composition
    composition: ClassVar[str] = (
        "parallel over classes (a record meets only its own class's rows); sequential with the statistics releases"
    )
    normalizes: ClassVar[bool] = True  # its rows are z-scored (False: no statistics are computed, spent or written)
    # poisson mode: a DP class histogram chooses its rows per class (False: no histogram is drawn or spent; marginals
    # takes its row count from its fitted model's total, post-processing of its own noisy counts)
    class_histogram: ClassVar[bool] = True
    accountant: ClassVar[str] = ""  # the accountant of its events where not the mode's ('rdp': zCDP events)
    needs_width: ClassVar[str] = ""  # why its plan needs the feature width d ('' where any d plans alike)

    @property
    def modes(self) -> tuple[str, ...]:
        return self.params.modes

    @property
    def mixes(self) -> bool:
        """Rows average records (l > 1): the join path, the per-group memory check."""
        return self.params.mixes

    # ---------------------------------------------------------------- privacy

    def relation(self, mode: str) -> str:
        """The key of ``privacy.accounting.RELATION_WORDS`` for this mechanism in ``mode``."""
        return relation_key(self.name, mode)

    def synthesis_events(self, mode: str, *, group_sizes, samples, mixing_order: int, clip: float, sigma_x: float,
                         label_noise_ratio: Optional[float] = None, gain: float = 1.0) -> list:  # fmt: skip
        """The events the synthesis spends at feature noise ``sigma_x``, one per group (parallel composition); a
        mechanism whose events are not a function of one noise scale (a fitted model) raises TypeError."""
        raise TypeError(f"{self.name}: its events come from its plan, not from a sigma_x")

    def budget_shares(self, privacy: PrivacyParams, params: MechanismParams) -> list[Share]:
        """Shares of the budget this mechanism spends beyond the release's statistics (``mechanisms.plan``), each
        calibrated alone by the planner and composed with the synthesis (p3gm: DP-EM)."""
        return []

    @abc.abstractmethod
    def plan(self, public: Public) -> SynthesisPlan:
        """This mechanism's plan for a release with these public facts: the rows per group, the noise (calibrated
        to what the budget planner left unless the config gives it) and the events."""

    def check_before_work(self, core: CoreSettings, dim: int) -> None:
        """Checks that need the input's width, run by the launcher before any row is read (PlanError and kin)."""

    # ---------------------------------------------------------------- rows

    def output_dim(self, params: MechanismParams, dim: int) -> int:
        return dim

    @abc.abstractmethod
    def synthesize(self, ctx: "InProcess") -> Iterator[tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]]:
        """(features, hard labels, label scores or None) chunks of an in-process release (``mechanisms.inprocess``)."""

    # ---------------------------------------------------------------- manifest and evaluation

    @abc.abstractmethod
    def label_caveat(self) -> str:
        """The manifest's second caveat: what the released labels and sizes are, in words."""

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
