"""Composing the releases of one dataset: the privacy maths of the release ledger (pure; storage.ledger keeps it).

A data platform publishes the same source again and again; every release spends budget on the same people. The
ledger records each release of a dataset id and states what all of them together guarantee.

Relations. Every release states its neighbouring relation (``privacy.accounting.RELATION_WORDS``). Releases compose
into one statement only under one relation:
- replace-one releases (mode ``fixed`` of every mechanism) compose with each other. DP-CDA's relation (replace one
  record's features within its class) is narrower than DPMix's (replace any record, label included): a guarantee
  for every DPMix neighbour pair holds for the within-class pairs, so a mixed history is stated under the narrower
  relation.
- add/remove releases (mode ``poisson``) compose with each other.
- a replace-one release and an add/remove release are REFUSED on one dataset id: turning one relation into the other
  is group privacy (a replacement is a removal and an addition), which doubles epsilon; the ledger does not do that
  silently.

How. The composed figure is (epsilon, delta) with delta the sum of the releases' deltas:
- Published ``fixed`` releases are composed from their DP events (the manifest's ``privacy.events``) with
  dp_accounting's RDP accountant: a release's Renyi curve is the largest, order by order, over its classes of
  (statistics o class k's mixing) -- a record meets its own class only, whichever it is, so the largest curve bounds
  every record without matching classes across releases -- and the releases' curves add up. The sampler's share of
  delta is kept aside as in a single release, and its bound is checked against it; where it does not fit, the
  figure falls back to the sum of the releases' epsilons.
- ``poisson`` releases are composed by their stated guarantees, summed (basic composition): each such release chose
  its sampling rates, row counts and noise from its own DP class histogram, so only its stated budget, not its
  events, was fixed before its data was read (``privacy.accounting``, adaptive stages). dp_accounting's composition
  of generic (epsilon, delta) claims gives the same figure to within 1e-4 at these deltas, so the sum is stated.
- A release not yet published (a reservation: its run is under way, or died before recording) counts with its
  target (epsilon, delta), added to the rest by basic composition: it has no events yet, and its target bounds them.

Adaptivity. The composed figure is sequential composition of releases whose settings do not depend on earlier
releases' outputs (a schedule). Where an analyst picks a release's settings after looking at earlier ones, the sum of
the stated epsilons (``sum_epsilon``, always shown) is the figure that holds under any such choice (basic composition
with a budget fixed in advance is a valid privacy filter: Rogers, Roth, Ullman and Vadhan 2016).
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction
from typing import Optional, Sequence

import dp_accounting
import numpy as np
from dp_accounting import rdp
from dp_accounting.rdp import rdp_privacy_accountant

from dpcda.privacy.accounting import RDP_ORDERS, RELATION_WORDS, SAMPLER_DELTA_SHARE, ReleaseEvents
from dpcda.privacy.domain import DomainEvent
from dpcda.privacy.errors import DpcdaError
from dpcda.privacy.events import (
    AimEvent,
    DpmixEvent,
    DpSgdEvent,
    GaussianStatsEvent,
    IteratedGaussianEvent,
    MarginalsEvent,
    MixingEvent,
    NonPrivateEvent,
    PerturbEvent,
)
from dpcda.privacy.noise import sampler_delta

EVENT_TYPES = {
    cls.__name__: cls
    for cls in (
        MixingEvent,
        DpmixEvent,
        PerturbEvent,
        GaussianStatsEvent,
        NonPrivateEvent,
        IteratedGaussianEvent,
        DpSgdEvent,
        MarginalsEvent,
        AimEvent,
        DomainEvent,
    )
}
FAMILY = {"fixed": "replace-one", "poisson": "add/remove"}


class LedgerError(DpcdaError, RuntimeError):
    """A release the ledger refuses (over the budget cap, a relation that does not compose) or cannot record."""


class ClaimError(LedgerError):
    """One release the ledger holds cannot be composed (``run``, ``problem``); the store names itself and the row."""

    def __init__(self, run: str, problem: str):
        super().__init__(f"ledger: run {run}: {problem}")
        self.run, self.problem = run, problem


# ---------------------------------------------------------------- events as JSON (the manifest's privacy.events)


def event_to_json(event) -> dict:
    """Exact rates (``Fraction``) are written as "p/q" strings, so they read back exactly."""
    fields = {k: str(v) if isinstance(v, Fraction) else v for k, v in dataclasses.asdict(event).items()}
    return {"type": type(event).__name__, **fields}


def event_from_json(data: dict):
    cls = EVENT_TYPES.get(data.get("type"))
    if cls is None:
        raise LedgerError(f"ledger: unknown privacy event type {data.get('type')!r}")
    names = {f.name for f in dataclasses.fields(cls)}
    fields = {k: v for k, v in data.items() if k in names}
    if cls is DpSgdEvent:
        try:
            fields["sampling_rate"] = Fraction(str(fields["sampling_rate"]))
        except (KeyError, ValueError, ZeroDivisionError):
            raise LedgerError(f"ledger: a DpSgdEvent without a valid sampling_rate: {data!r}") from None
    return cls(**fields)


def release_events_to_json(events: ReleaseEvents) -> dict:
    return {
        "mode": events.mode,
        "shared": [event_to_json(e) for e in events.shared],
        "per_class": [event_to_json(e) for e in events.per_class],
        "adaptive": [[event_to_json(e), d] for e, d in events.adaptive],
        "gaussian_draws": int(events.gaussian_draws),
        "binomial_draws": int(events.binomial_draws),
    }


def release_events_from_json(data: dict) -> ReleaseEvents:
    return ReleaseEvents(
        mode=data["mode"],
        shared=tuple(event_from_json(e) for e in data.get("shared", ())),
        per_class=tuple(event_from_json(e) for e in data.get("per_class", ())),
        adaptive=tuple((event_from_json(e), float(d)) for e, d in data.get("adaptive", ())),
        gaussian_draws=int(data.get("gaussian_draws", 0)),
        binomial_draws=int(data.get("binomial_draws", 0)),
    )


# ---------------------------------------------------------------- composition


@dataclasses.dataclass(frozen=True)
class Claim:
    """One release as the ledger sees it: its stated guarantee, and its events once published."""

    run: str
    mode: str
    relation: str  # a key of RELATION_WORDS
    epsilon: float  # the stated guarantee (a reservation: the target); math.inf for none
    delta: float
    events: Optional[dict] = None  # release_events_to_json(...) of a published release


@dataclasses.dataclass(frozen=True)
class Composition:
    epsilon: float
    delta: float
    sum_epsilon: float
    releases: int
    relation: str  # words
    method: str


def _release_rdp(events: ReleaseEvents) -> np.ndarray:
    """The release's Renyi curve on RDP_ORDERS: the largest over classes of (shared o class k), order by order."""
    curves = []
    for group in dict.fromkeys(events.per_class) or [None]:
        evs = [*events.shared, *([group] if group is not None else [])]
        dp = [e.to_dp_event() for e in evs]
        if any(isinstance(e, dp_accounting.NonPrivateDpEvent) for e in dp):
            return np.full(len(RDP_ORDERS), np.inf)
        acc = rdp.RdpAccountant(orders=RDP_ORDERS, neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
        acc.compose(dp_accounting.ComposedDpEvent(dp))
        curves.append(np.asarray(acc.rdp, np.float64))
    return np.max(np.stack(curves), axis=0)


def _compose_fixed_events(claims: Sequence[Claim]) -> tuple[float, float]:
    """(epsilon, delta) of published fixed releases composed from their events (RDP), or the sum where that fails."""
    delta = sum(c.delta for c in claims)
    summed = sum(c.epsilon for c in claims)
    events = []
    for c in claims:
        try:
            events.append(release_events_from_json(c.events))
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise ClaimError(c.run, f"malformed privacy events ({type(err).__name__})") from None
    if any(e.adaptive for e in events):  # fixed mode has no adaptive stage; never expected
        return summed, delta
    total = np.sum(np.stack([_release_rdp(e) for e in events]), axis=0)
    if not np.all(np.isfinite(total)):
        return math.inf, delta
    reserve = delta * SAMPLER_DELTA_SHARE
    eps, _ = rdp_privacy_accountant.compute_epsilon(RDP_ORDERS, total, delta - reserve)
    spent = sampler_delta(
        eps,
        gaussian_draws=sum(e.gaussian_draws for e in events),
        binomial_draws=sum(e.binomial_draws for e in events),
    )
    if not (spent <= reserve and math.isfinite(eps)):
        return summed, delta
    return min(float(eps), summed), delta


def claim_problem(claim: Claim) -> Optional[str]:
    """What makes ``claim`` unusable for composition, or None. A stated epsilon that is not positive (zero, negative,
    NaN) or a delta outside [0, 1) would count as no spend, or lower the spend of the others."""
    if claim.mode not in FAMILY:
        return "unknown mode"
    if claim.relation not in RELATION_WORDS or claim.relation.rsplit("/", 1)[-1] != claim.mode:
        return f"relation not one of mode {claim.mode}'s"
    if not (isinstance(claim.epsilon, (int, float)) and claim.epsilon > 0 and not math.isnan(claim.epsilon)):
        return "epsilon is not a positive number"
    if not (isinstance(claim.delta, (int, float)) and 0 <= claim.delta < 1):
        return "delta is not in [0, 1)"
    return None


def compose(claims: Sequence[Claim]) -> Composition:
    """What ``claims`` (releases of one dataset) guarantee together; LedgerError if their relations do not compose,
    a claim is unusable (``claim_problem``), or the published releases' events compose to less than one of them
    states alone (events truncated or edited: composition never lowers a release's own guarantee)."""
    if not claims:
        return Composition(0.0, 0.0, 0.0, 0, "", "nothing released")
    for c in claims:
        problem = claim_problem(c)
        if problem is not None:
            raise ClaimError(c.run, f"{problem}; a release that would count as no spend is refused")
    families = {FAMILY[c.mode] for c in claims}
    if len(families) > 1:
        raise LedgerError(
            "ledger: replace-one (mode fixed) and add/remove (mode poisson) releases do not compose into one "
            "statement; keep one mode per dataset id"
        )
    keys = list(dict.fromkeys(c.relation for c in claims))
    # several relations of one family: the family's own words (fixed: replace within a class; poisson: add/remove)
    relation = RELATION_WORDS[keys[0]] if len(keys) == 1 else RELATION_WORDS[claims[0].mode]
    summed = sum(c.epsilon for c in claims)
    delta = sum(c.delta for c in claims)
    tight = [c for c in claims if c.mode == "fixed" and c.events is not None]
    if not tight:
        return Composition(summed, delta, summed, len(claims), relation, "sum of the stated epsilons")
    for c in tight:  # each alone, at its own delta: the same RDP maths gave it its stated epsilon
        alone, _ = _compose_fixed_events([c])
        if not alone >= c.epsilon * (1 - 1e-9):
            raise ClaimError(
                c.run,
                "its published events compose to less than it states (they are truncated or edited); nothing is "
                "composed from them",
            )
    eps_tight, _ = _compose_fixed_events(tight)
    # at the summed delta the composition can state less than one release does at its own; never report below it
    eps_tight = max(eps_tight, max(c.epsilon for c in tight))
    rest = sum(c.epsilon for c in claims if not (c.mode == "fixed" and c.events is not None))
    method = "RDP composition of the published releases' events"
    if len(tight) < len(claims):
        method += f", plus {len(claims) - len(tight)} reservation(s) at their target epsilon"
    return Composition(eps_tight + rest, delta, summed, len(claims), relation, method)


def check_budget(dataset_id: str, history: Sequence[Claim], request: Claim, cap: Optional[float]) -> dict:
    """The ledger's decision on a new release, before any of its data is read: figures before and after; raises
    LedgerError naming the spent and requested budget when the composed epsilon would pass ``cap``."""
    before = compose(history)
    problem = claim_problem(request)
    if problem is not None:
        raise LedgerError(f"ledger: this release (run {request.run}): {problem}")
    if history and FAMILY[request.mode] != FAMILY[history[0].mode]:
        theirs = "replace-one (mode fixed)" if request.mode == "poisson" else "add/remove (mode poisson)"
        raise LedgerError(
            f"ledger: dataset '{dataset_id}' holds {theirs} releases and this release is mode {request.mode}: their "
            f"guarantees do not compose into one statement (refused; use mode {history[0].mode} or another "
            f"--dataset-id)"
        )
    after = compose([*history, request])
    if cap is not None and not after.epsilon <= cap:
        raise LedgerError(
            f"ledger: dataset '{dataset_id}' has spent epsilon {before.epsilon:.4g} (delta {before.delta:.3g}, "
            f"{before.releases} release(s)); this release asks {request.epsilon:.4g} (delta {request.delta:.3g}); "
            f"together up to {after.epsilon:.4g}, over the budget cap {cap:g}: refused before reading any data"
        )
    return {
        "before": {"epsilon": before.epsilon, "delta": before.delta, "releases": before.releases},
        "after_at_most": {"epsilon": after.epsilon, "delta": after.delta},
        "budget_cap": cap,
        "method": after.method,
    }
