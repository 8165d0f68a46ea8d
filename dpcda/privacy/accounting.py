"""Pure accounting of a release: events in, epsilon and its breakdown out.

Relations: ``fixed`` accounts under replace-one (RDP, ``SampledWithoutReplacementDpEvent``);
``poisson`` under add/remove-one (PLD, with RDP as a cross-check). A record meets only its own
class's rows, so the class mixing events compose in parallel: the release's epsilon is the largest,
over classes k, of (shared events) composed with (class k's mixing).

Adaptive stages. Events in ``ReleaseEvents.adaptive`` are released first and their outputs choose the later
events' parameters (poisson mode: the DP class histogram sets q_k, T_k and sigma_x). Each is accounted alone at
its own delta, and the rest is calibrated, for whatever the adaptive outputs were, to the remaining
(epsilon, delta); the adaptive composition theorem for (epsilon, delta)-DP then gives the sum of both, whatever
the adaptive choice (Dwork, Rothblum and Vadhan 2010: basic composition holds for adaptively chosen mechanisms).

Delta. A fixed share of the target delta (``SAMPLER_DELTA_SHARE``) is set aside for the noise sampler's
finite precision (``privacy.noise.sampler_delta``, a bound that is checked to fit); the accountant works with the
rest. Where the PLD reads an epsilon, a further share of the delta it is given (``PLD_ROUNDOFF_SHARE``) is set aside
for the round-off of its float64 composition (see ``PLD_MIN_DELTA``): its epsilon is read at the remainder.
``Accounting.delta_breakdown`` says where each part went; its sum is at most the target.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional, Sequence

import dp_accounting
from dp_accounting import pld, rdp

from dpcda.privacy.errors import DpcdaError
from dpcda.privacy.events import Event, MixingEvent, Mode
from dpcda.privacy.noise import sampler_delta

SAMPLER_DELTA_SHARE = 1e-6  # of the target delta, reserved for the sampler (its bound is far smaller)

# Integer orders only above 2: the without-replacement bound is defined on integers, and a short
# list keeps calibration fast. Tests compare against dp_accounting with the same list.
RDP_ORDERS: tuple[float, ...] = (1.25, 1.5, 1.75, *range(2, 33), 40, 48, 56, 64, 80, 96, 128)
# A subset, for the coarse stage of calibration: its epsilon is never below the full list's.
COARSE_RDP_ORDERS: tuple[float, ...] = (1.5, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
PLD_DISCRETIZATION = 1e-3  # pessimistic rounding: coarser is looser, never optimistic

ACCOUNTANT_BY_MODE = {"fixed": "rdp", "poisson": "pld"}
RELATION_BY_MODE = {
    "fixed": dp_accounting.NeighboringRelation.REPLACE_ONE,
    "poisson": dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
}
RELATION_WORDS = {
    "fixed": (
        "replace one record's features with any other features within the same class "
        "(label unchanged); class sizes are public"
    ),
    "poisson": "add or remove one record (features and label)",
    "dpmix/fixed": ("replace one record (features and label) with any other record; the dataset size is public"),
    "marginals/poisson": "add or remove one record (all its columns, the label included); the row count is private",
}


def relation_key(mechanism: str, mode: Mode) -> str:
    """The key of RELATION_WORDS for a mechanism's mode (DPMix's replace-one lets the label change)."""
    return f"{mechanism}/{mode}" if f"{mechanism}/{mode}" in RELATION_WORDS else mode


class RoundoffReservingPLDAccountant(pld.PLDAccountant):
    """dp_accounting's PLD accountant with the share ``PLD_ROUNDOFF_SHARE`` of delta set aside for its round-off.

    ``get_epsilon(delta)`` is dp_accounting's epsilon at ``delta (1 - PLD_ROUNDOFF_SHARE)``; ``get_delta(epsilon)`` is
    dp_accounting's delta plus that share (its inverse). The share covers the float64 round-off of the FFT
    composition, which lands on delta (see ``PLD_MIN_DELTA``); ``check_pld_delta`` refuses a delta too small for the
    share to cover it. Every PLD number of the product (accounting, calibration searches, the adaptive stages) is read
    through this class; ``benchmarks/checks/pld_resolution.py`` measures the round-off with dp_accounting's own methods.
    """

    def get_epsilon(self, target_delta: float) -> float:
        return super().get_epsilon(target_delta * (1.0 - PLD_ROUNDOFF_SHARE))

    def get_delta(self, target_epsilon: float) -> float:
        return super().get_delta(target_epsilon) / (1.0 - PLD_ROUNDOFF_SHARE)


def make_accountant(mode: Mode, accountant: str | None = None) -> dp_accounting.PrivacyAccountant:
    """A fresh accountant for ``mode`` (``rdp``, ``rdp-coarse`` or ``pld``; default the mode's own)."""
    name = accountant or ACCOUNTANT_BY_MODE[mode]
    relation = RELATION_BY_MODE[mode]
    if name in ("rdp", "rdp-coarse"):
        orders = RDP_ORDERS if name == "rdp" else COARSE_RDP_ORDERS
        return rdp.RdpAccountant(orders=orders, neighboring_relation=relation)
    if name == "pld":
        if mode == "fixed":
            raise ValueError("PLD does not support sampling without replacement; use rdp")
        return RoundoffReservingPLDAccountant(
            neighboring_relation=relation, value_discretization_interval=PLD_DISCRETIZATION
        )
    raise ValueError(f"accountant: unknown {name!r}; expected 'rdp' or 'pld'")


def epsilon_of(mode: Mode, events: Sequence[Event], delta: float, accountant: str | None = None) -> float:
    """Epsilon of the sequential composition of ``events`` (no parallel composition here)."""
    acc = make_accountant(mode, accountant)
    dp_events = [e.to_dp_event() for e in events]
    if any(isinstance(e, dp_accounting.NonPrivateDpEvent) for e in dp_events):
        return math.inf
    acc.compose(dp_accounting.ComposedDpEvent(dp_events))
    return float(acc.get_epsilon(delta))


class AccountingError(DpcdaError, ValueError):
    """The events cannot fit the delta budget (e.g. the sampler's bound at a very large epsilon)."""


# dp_accounting's PLD composes by FFT in float64, and the round-off lands on the delta it reports as an absolute error
# that grows about linearly with the number of compositions n, about 1.2e-16 n: 7e-13 at 6,000, 8e-12 at 60,000, 2e-10
# at 2,000,000, measured against a direct convolution of the same pessimistic PMFs
# (benchmarks/checks/pld_resolution.py); below that its epsilon is round-off (negative deltas and infinity masses,
# epsilon zig-zagging as the noise grows).
# Where the PLD is the accountant of record (add/remove, poisson mode) its delta must be at least
# max(PLD_MIN_DELTA, PLD_DELTA_PER_COMPOSITION n) (pld_least_delta), so that 2e-16 n, the round-off with a margin, fits
# in the share PLD_ROUNDOFF_SHARE of delta that the accountant sets aside for it (RoundoffReservingPLDAccountant).
# Fixed mode's RDP has no such floor. A Gaussian accounted alone (statistics, the class histogram, DP-EM's shares) is
# not held to this floor: the reserve (1e-3 of its delta) may be smaller than its round-off, but its PLD, truncated
# tails included, is pessimistic against dp_accounting's exact GaussianPrivacyLoss down to delta 1e-14
# (tests/test_privacy.py), below which such a share is refused (privacy.calibration.ALONE_MIN_DELTA).
PLD_MIN_DELTA = 1e-8
PLD_ROUNDOFF_SHARE = 1e-3
PLD_DELTA_PER_COMPOSITION = 2e-13  # 2e-16 (the measured 1.2e-16 with a margin) / PLD_ROUNDOFF_SHARE


def compositions(event: dp_accounting.DpEvent) -> int:
    """How many mechanisms the PLD composes for ``event`` (self-compositions multiply, compositions add)."""
    if isinstance(event, dp_accounting.SelfComposedDpEvent):
        return event.count * compositions(event.event)
    if isinstance(event, dp_accounting.ComposedDpEvent):
        return sum(compositions(e) for e in event.events)
    return 1


def pld_least_delta(n: int) -> float:
    """The least delta the PLD accountant resolves for ``n`` composed mechanisms (see PLD_MIN_DELTA)."""
    return max(PLD_MIN_DELTA, PLD_DELTA_PER_COMPOSITION * n)


def round_up(x: float, digits: int = 3) -> float:
    """``x`` rounded up to ``digits`` significant digits, with room for the last bit (for a stated least value)."""
    unit = 10.0 ** (math.floor(math.log10(x)) - digits + 1)
    return math.ceil(x * (1 + 1e-9) / unit) * unit


def check_pld_delta(delta: float, events: Sequence[Event], stated: Optional[float] = None) -> None:
    """Refuses an accountant ``delta`` the PLD cannot resolve in float64 for ``events`` (none for a non-private
    claim). ``stated``: the release's delta, of which ``delta`` is the accountant's share, for the message."""
    dp_events = [e.to_dp_event() for e in events]
    if any(isinstance(e, dp_accounting.NonPrivateDpEvent) for e in dp_events):
        return  # epsilon is infinite: no PLD number is claimed
    n = sum(compositions(e) for e in dp_events)
    least = pld_least_delta(n)
    if not delta >= least:
        what = (
            f"delta: {stated:g} is below {round_up(least * stated / delta * 1.01):g}"  # 1 %: n may be a DP count
            if stated
            else f"delta: the accountant's share {delta:.6g} is below {least:.3g}"
        )
        raise AccountingError(
            f"{what}, the least the PLD accountant resolves in float64 for {n} composed mechanisms; raise delta"
        )


@dataclasses.dataclass(frozen=True)
class ReleaseEvents:
    """All privacy events of one release: ``shared`` touch every record, ``per_class`` one class each.

    ``adaptive``: (event, delta) pairs released first, each accounted alone at its delta (see the module doc).
    ``gaussian_draws`` and ``binomial_draws`` count the sampler's draws, for its delta term.
    """

    mode: Mode
    shared: tuple[Event, ...]
    per_class: tuple[MixingEvent, ...]
    adaptive: tuple[tuple[Event, float], ...] = ()
    gaussian_draws: int = 0
    binomial_draws: int = 0


@dataclasses.dataclass(frozen=True)
class Accounting:
    epsilon: float
    delta: float
    accountant: str
    relation: str
    components: dict  # name -> epsilon of that component alone at the accountant's delta
    worst_class_event: MixingEvent | None
    cross_check: dict  # other accountant name -> epsilon
    delta_breakdown: dict = dataclasses.field(default_factory=dict)  # part -> delta; sums to <= delta
    events: Optional[ReleaseEvents] = None  # what was accounted (the manifest's privacy.events; the ledger's input)


def accountant_delta(delta: float, adaptive_deltas=()) -> float:
    """The delta the accountant may use for the non-adaptive events: the target minus the reserved parts."""
    rest = delta * (1.0 - SAMPLER_DELTA_SHARE) - sum(adaptive_deltas)
    if not rest > 0:
        raise AccountingError(f"delta={delta}: nothing left for the accountant after the reserved shares")
    return rest


def adaptive_epsilon(mode: Mode, event: Event, delta: float) -> float:
    """Epsilon of one adaptive event alone at its own delta (PLD under the mode's relation where it applies)."""
    return epsilon_of(mode, [event], delta, accountant="pld" if mode == "poisson" else None)


def _distinct(events: Sequence[MixingEvent]) -> list[MixingEvent]:
    return list(dict.fromkeys(events))


def account(
    events: ReleaseEvents,
    delta: float,
    *,
    cross_check: bool = True,
    relation: Optional[str] = None,
    accountant: Optional[str] = None,
) -> Accounting:
    """Epsilon at ``delta`` of a release: adaptive stages + max over classes of shared o class mixing.

    ``accountant``: 'rdp' where a mechanism's events are zCDP (the marginals' selection rounds, which the PLD
    accountant does not take); default the mode's own. Adaptive stages are accounted alone as ever."""
    mode = events.mode
    name = accountant or ACCOUNTANT_BY_MODE[mode]
    # a shared event's own additive delta (privacy.domain: the value thresholds) is reserved out of the accountant's
    own_deltas = {e.name: e.reserved_delta for e in events.shared if getattr(e, "reserved_delta", 0.0)}
    acc_delta = accountant_delta(delta, [d for _, d in events.adaptive] + list(own_deltas.values()))
    if name == "pld":
        for group in [[*events.shared, ev] for ev in _distinct(events.per_class)] or [events.shared]:
            check_pld_delta(acc_delta, group, stated=delta)
    worst = None
    eps = epsilon_of(mode, events.shared, acc_delta, name) if events.shared else 0.0
    for ev in _distinct(events.per_class):
        e = epsilon_of(mode, [*events.shared, ev], acc_delta, name)
        if worst is None or e > eps:
            worst, eps = ev, e
    components = {}
    # where the PLD reads an epsilon (the accountant's share, and the adaptive stages in poisson mode), it reads it at
    # (1 - PLD_ROUNDOFF_SHARE) of that share; the rest is listed as pld_roundoff
    kept = 1.0 - PLD_ROUNDOFF_SHARE if name == "pld" else 1.0
    adaptive_kept = 1.0 - PLD_ROUNDOFF_SHARE if mode == "poisson" else 1.0  # adaptive_epsilon reads the PLD there
    breakdown = {"accountant": acc_delta * kept}
    for ev, d in events.adaptive:
        e = adaptive_epsilon(mode, ev, d)
        components[ev.name] = e
        breakdown[ev.name] = d * adaptive_kept
        eps += e
    adaptive_delta = sum(d for _, d in events.adaptive) if mode == "poisson" else 0.0
    reserved = (acc_delta if name == "pld" else 0.0) + adaptive_delta
    if name == "pld" or reserved > 0:
        breakdown["pld_roundoff"] = reserved * PLD_ROUNDOFF_SHARE
    components.update({e.name: epsilon_of(mode, [e], acc_delta, name) for e in events.shared})
    if worst is not None:
        components[getattr(worst, "component", "mixing")] = epsilon_of(mode, [worst], acc_delta, name)
    spent = 0.0
    if math.isfinite(eps):  # infinite epsilon: no guarantee for the sampler to weaken
        spent = sampler_delta(eps, gaussian_draws=events.gaussian_draws, binomial_draws=events.binomial_draws)
    if spent > delta * SAMPLER_DELTA_SHARE:
        raise AccountingError(
            f"epsilon={eps:.4g}: the noise sampler's delta bound {spent:.3g} exceeds its share "
            f"{delta * SAMPLER_DELTA_SHARE:.3g} of delta; lower epsilon or raise delta"
        )
    breakdown["sampler"] = spent
    for e in events.shared:
        if e.name in own_deltas:
            if not e.covers(eps):
                raise AccountingError(f"{e.name}: its threshold term exceeds its reserved delta at epsilon={eps:.4g}")
            breakdown[f"{e.name}_thresholds"] = own_deltas[e.name]
    checks = {}
    if cross_check and name == "pld" and worst is not None:
        rest = epsilon_of(mode, [*events.shared, worst], acc_delta, accountant="rdp")
        checks["rdp"] = rest + sum(components[ev.name] for ev, _ in events.adaptive)
    return Accounting(
        epsilon=eps,
        delta=delta,
        accountant=name,
        relation=RELATION_WORDS[relation or mode],
        components=components,
        worst_class_event=worst,
        cross_check=checks,
        delta_breakdown=breakdown,
        events=events,
    )
