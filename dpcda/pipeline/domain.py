"""The DP domain step of a table release in the launcher: what it derives (decided before any row is read), its
budget (the release's planner), and its own Beam job, run before the release's, whose output (a complete
``TableSchema``: DP outputs and public declarations only) the release then runs with.

    ReadColumns -> DeriveDomain -> WriteDomain (domain.json in the run directory)
"""

from __future__ import annotations

import json
import logging
from typing import Optional

import apache_beam as beam
import pyarrow as pa

from dpcda.mechanisms.domain.derive import assemble  # noqa: F401 - the launcher completes public-only tables with it
from dpcda.mechanisms.domain.request import DomainRequest, request
from dpcda.mechanisms.plan import release_budget
from dpcda.privacy.budget import RhoShare
from dpcda.privacy.domain import DomainEvent, split_domain
from dpcda.schemas.table import TableSchema, parse_table_schema
from dpcda.storage.paths import join, open_file
from dpcda.storage.tables import footer_dictionaries

log = logging.getLogger("dpcda.release")
DOMAIN_FILE = "domain.json"


def domain_request(cfg, files: list[str], arrow) -> Optional[DomainRequest]:
    """What the domain step of ``cfg``'s table derives from the input (``arrow``: the first file's Arrow schema), or
    None where the table: section declares every column; SchemaError naming a column that cannot be synthesised.
    Reads the files' footers (dictionary sizes; no row)."""
    table = cfg.table
    if table.complete and not table.undeclared(arrow):
        return None
    req = request(table, arrow, footer_dictionaries(files))
    return None if req.empty else req


def domain_share(cfg, req: DomainRequest) -> RhoShare:
    """The domain step's share of the release's budget (``privacy.budget.RhoShare``), as the planner takes it."""

    def event_of(rho: float, reserved: float, epsilon: float) -> DomainEvent:
        return split_domain(
            rho,
            coarse=len(req.numeric),
            values=len(req.counted),
            fine=len(req.numeric),
            reserved_delta=reserved,
            epsilon=epsilon,
            coarse_cells=req.coarse_cells,
            fine_cells=req.fine_cells,
        )

    return RhoShare("domain", cfg.domain_budget_share, event_of=event_of)


def plan_domain(cfg, req: DomainRequest) -> DomainEvent:
    """The domain step's event, planned by the release's budget planner with the release's other shares (so that the
    release, planning again with the event given, splits the rest the same way)."""
    planned = release_budget(cfg.privacy, cfg.mechanism_params, 1, domain=domain_share(cfg, req))
    return planned.get("domain").event


class _WriteDomainFn(beam.DoFn):
    def __init__(self, path: str):
        self.path = path

    def process(self, schema: TableSchema):
        with open_file(self.path, "wb") as fh:
            fh.write(json.dumps(schema.model_dump(mode="json"), indent=2).encode())
        yield self.path


def build_domain(p: beam.Pipeline, key, files, req: DomainRequest, event: DomainEvent, share: float, workdir: str,
                 build) -> str:  # fmt: skip
    """Wires the domain step into ``p`` (its own job, with its own noise ``key``, a PCollection of one key drawn on
    a worker); returns where it writes the complete schema (in the run directory)."""
    from dpcda.transforms.domain import DeriveDomain, ReadColumns

    path = join(workdir, DOMAIN_FILE)
    batches = p | "ReadColumns" >> ReadColumns(files, [d.name for d in req.derive])
    schema = batches | "DeriveDomain" >> DeriveDomain(req, event, key, share, expected_build=build)
    _ = schema | "WriteDomain" >> beam.ParDo(_WriteDomainFn(path))
    return path


def read_schema(path: str) -> TableSchema:
    """The complete schema the domain step wrote."""
    with open_file(path) as fh:
        derived = parse_table_schema(json.loads(fh.read()), path)
    log.info("stage=domain columns=%d derived=%d", len(derived.columns), len(derived.domain.derived))
    return derived


def with_schema(cfg, schema: TableSchema):
    """``cfg`` with the complete table ``schema`` (its label's classes as num_classes), validated again."""
    from dpcda.schemas.config import ReleaseConfig

    fields = {k: getattr(cfg, k) for k in cfg.model_fields_set}
    fields.update(table=schema, num_classes=schema.num_classes)
    return ReleaseConfig(**fields)


def account_table(
    *, epsilon, delta: float, columns: int, numeric: int, categorical: int, share, histogram_budget_share=None
) -> dict:
    """``dpcda account --mechanism marginals``: a table release's split without data, as the release's planner makes
    it: the class histogram, the DP domain step for ``numeric`` and ``categorical`` derived columns (the label among
    them if derived; its grids' noise draws counted at their largest), and marginals (mst-label) over ``columns``."""
    from dpcda.mechanisms.domain.grid import Coarse, Fine
    from dpcda.mechanisms.marginals.selection import label_pairs
    from dpcda.privacy.accounting import RELATION_WORDS, ReleaseEvents, account
    from dpcda.privacy.calibration import CalibrationError
    from dpcda.privacy.marginals import calibrate
    from dpcda.schemas.config import release_settings

    if epsilon is None:
        raise CalibrationError("marginals: give --epsilon (its counts' noise is calibrated to a target)")
    if not (columns >= 2 and 0 <= numeric and 0 <= categorical and numeric + categorical <= columns):
        raise CalibrationError("--table-columns: at least 2 (the label included), the derived ones among them")
    cfg = release_settings(
        mechanism="marginals", mode="poisson", epsilon=epsilon, delta=delta, domain_budget_share=share,
        histogram_budget_share=histogram_budget_share,
    )  # fmt: skip
    derived = numeric + categorical
    domain = None
    if derived:
        cells = Coarse.of(pa.float64()).cells

        def event_of(rho, reserved, eps):
            return split_domain(
                rho,
                coarse=numeric,
                values=derived,
                fine=numeric,
                reserved_delta=reserved,
                epsilon=eps,
                coarse_cells=numeric * cells,
                fine_cells=numeric * Fine(0.0, 1.0, False).cells,
            )

        domain = RhoShare("domain", cfg.domain_budget_share, event_of=event_of)
    planned = release_budget(cfg.privacy, cfg.mechanism_params, 1, domain=domain)
    ev = calibrate(
        target_epsilon=planned.synthesis_epsilon,
        delta=planned.accountant_delta,
        one_way=columns,
        rounds=columns - 1,
        two_way=columns - 1 + label_pairs("mst-label", columns),
        shared=planned.shared,
        stated_delta=delta,
    )
    draws = sum(getattr(s.event, "gaussian_draws", 0) for s in planned.shares)
    acc = account(
        ReleaseEvents("poisson", planned.shared, (ev,), planned.adaptive, gaussian_draws=draws),
        delta,
        relation="marginals/poisson",
        accountant="rdp",
    )
    out = {
        "mechanism": "marginals",
        "mode": "poisson",
        "shares": {},
        "synthesis_epsilon": planned.synthesis_epsilon,
        "marginals_rho": ev.rho,
        "one_way_noise_std": ev.one_way_std,
        "two_way_noise_std": ev.two_way_std,
        "epsilon": acc.epsilon,
        "delta": delta,
        "target_epsilon": epsilon,
        "accountant": acc.accountant,
        "neighbouring_relation": RELATION_WORDS["marginals/poisson"],
        "components": acc.components,
        "delta_breakdown": acc.delta_breakdown,
        "note": "selection mst-label; the class histogram's share is accounted alone (adaptive composition); the "
        "domain step's zCDP share and its thresholds' reserved delta as a release plans them",
    }
    for s in planned.shares:
        entry = {"epsilon": s.epsilon, "delta": s.delta}
        if s.name == "domain":
            e = s.event
            entry.update(rho=e.rho, share=cfg.domain_budget_share, value_threshold=e.threshold,
                         reserved_delta=e.reserved_delta, **{f"{k}_noise_std": getattr(e, f"{k}_std") for k in
                                                            ("coarse", "values", "fine") if getattr(e, k)})  # fmt: skip
        else:
            entry.update(noise_multiplier=s.noise_multiplier, adaptive=True)
        out["shares"][s.name] = entry
    return out
