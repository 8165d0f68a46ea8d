"""Pure accounting of a release: events in, epsilon and its breakdown out.

Relations: ``fixed`` accounts under replace-one (RDP, ``SampledWithoutReplacementDpEvent``);
``poisson`` under add/remove-one (PLD, with RDP as a cross-check). A record meets only its own
class's rows, so the class mixing events compose in parallel: the release's epsilon is the largest,
over classes k, of (shared events) composed with (class k's mixing).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import dp_accounting
from dp_accounting import pld, rdp

from privacy.events import Event, MixingEvent, Mode

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
    "fixed": ("replace one record's features with any other features within the same class "
              "(label unchanged); class sizes are public"),
    "poisson": "add or remove one record (features and label)",
}


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
        return pld.PLDAccountant(neighboring_relation=relation,
                                 value_discretization_interval=PLD_DISCRETIZATION)
    raise ValueError(f"accountant: unknown {name!r}; expected 'rdp' or 'pld'")


def epsilon_of(mode: Mode, events: Sequence[Event], delta: float, accountant: str | None = None) -> float:
    """Epsilon of the sequential composition of ``events`` (no parallel composition here)."""
    acc = make_accountant(mode, accountant)
    dp_events = [e.to_dp_event() for e in events]
    if any(isinstance(e, dp_accounting.NonPrivateDpEvent) for e in dp_events):
        return math.inf
    acc.compose(dp_accounting.ComposedDpEvent(dp_events))
    return float(acc.get_epsilon(delta))


@dataclasses.dataclass(frozen=True)
class ReleaseEvents:
    """All privacy events of one release: ``shared`` touch every record, ``per_class`` one class each."""

    mode: Mode
    shared: tuple[Event, ...]
    per_class: tuple[MixingEvent, ...]


@dataclasses.dataclass(frozen=True)
class Accounting:
    epsilon: float
    delta: float
    accountant: str
    relation: str
    components: dict  # name -> epsilon of that component alone at ``delta``
    worst_class_event: MixingEvent | None
    cross_check: dict  # other accountant name -> epsilon


def _distinct(events: Sequence[MixingEvent]) -> list[MixingEvent]:
    return list(dict.fromkeys(events))


def account(events: ReleaseEvents, delta: float, *, cross_check: bool = True) -> Accounting:
    """Epsilon at ``delta`` of a release: max over classes of shared ∘ class mixing."""
    mode = events.mode
    name = ACCOUNTANT_BY_MODE[mode]
    worst = None
    eps = epsilon_of(mode, events.shared, delta) if events.shared else 0.0
    for ev in _distinct(events.per_class):
        e = epsilon_of(mode, [*events.shared, ev], delta)
        if worst is None or e > eps:
            worst, eps = ev, e
    components = {e.name: epsilon_of(mode, [e], delta) for e in events.shared}
    if worst is not None:
        components["mixing"] = epsilon_of(mode, [worst], delta)
    checks = {}
    if cross_check and mode == "poisson" and worst is not None:
        checks["rdp"] = epsilon_of(mode, [*events.shared, worst], delta, accountant="rdp")
    return Accounting(epsilon=eps, delta=delta, accountant=name, relation=RELATION_WORDS[mode],
                      components=components, worst_class_event=worst, cross_check=checks)
