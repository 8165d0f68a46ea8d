"""The DP domain step of a table release in the launcher: what it derives (decided before any row is read), its
budget (the release's planner), and its own Beam job, run before the release's, whose output (a complete
``TableSchema``: DP outputs and public declarations only) the release then runs with.

    DeriveDomain (two passes over the input files) -> WriteDomain (domain.json in the run directory)
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
from dpcda.storage.paths import InputError, join, open_file

log = logging.getLogger("dpcda.release")
DOMAIN_FILE = "domain.json"


def domain_request(cfg, files: list[str], arrow) -> Optional[DomainRequest]:
    """What the domain step of ``cfg``'s table derives from the input (``arrow``: the first file's Arrow schema), or
    None where the table: section declares every column; SchemaError naming a column whose type cannot be
    synthesised. Reads the schema only (public): no footer statistic, no row."""
    table = cfg.table
    if table.complete and not table.undeclared(arrow):
        return None
    req = request(table, arrow)
    if req.empty:
        return None
    same_types(files, [d.name for d in req.derive], arrow)
    return req


def _counted_type(t):
    """A column's type as the domain step counts its values: a dictionary as its values, a large string as a string."""
    if pa.types.is_dictionary(t):
        t = t.value_type
    return pa.string() if pa.types.is_large_string(t) else t


def same_types(files: list[str], names: list[str], arrow) -> None:
    """Refuses (InputError, one line, before any budget is spent) a file whose footer gives one of the derived
    columns ``names`` another type than the first file's ``arrow`` schema does: the domain step counts each file's
    stored values (an int 12 and a float 12.0 are two values; a timestamp's integer is in its file's unit). Footers
    only: no row is read."""
    from dpcda.storage.tables import arrow_schema_of, check_columns

    want = {n: _counted_type(arrow.field(n).type) for n in names}
    for path in files[1:]:
        got = arrow_schema_of(path)
        check_columns(path, names, got)
        for n, t in want.items():
            other = _counted_type(got.field(n).type)
            if other != t:
                raise InputError(
                    f"{path}: column '{n}' is {other} here and {t} in {files[0]}; write every shard with one type for "
                    f"it, or declare the column in table:"
                )


def domain_share(share: float, *, numeric: int, counted: int, coarse_cells: int, fine_cells: int) -> RhoShare:
    """The domain step's ``share`` of the release's budget (``privacy.budget.RhoShare``), as the planner takes it:
    ``numeric`` columns' coarse and fine counts (``coarse_cells`` and ``fine_cells`` cells in all) and ``counted``
    columns' thresholded value counts (``privacy.domain.split_domain``)."""

    def event_of(rho: float, reserved: float, epsilon: float) -> DomainEvent:
        return split_domain(
            rho,
            coarse=numeric,
            values=counted,
            fine=numeric,
            reserved_delta=reserved,
            epsilon=epsilon,
            coarse_cells=coarse_cells,
            fine_cells=fine_cells,
        )

    return RhoShare("domain", share, event_of=event_of)


def request_share(cfg, req: DomainRequest) -> RhoShare:
    """The share of ``cfg``'s release that derives ``req``."""
    return domain_share(
        cfg.domain_budget_share,
        numeric=len(req.numeric),
        counted=len(req.counted),
        coarse_cells=req.coarse_cells,
        fine_cells=req.fine_cells,
    )


def plan_domain(cfg, req: DomainRequest) -> DomainEvent:
    """The domain step's event, planned by the release's budget planner with the release's other shares (so that the
    release, planning again with the event given, splits the rest the same way)."""
    planned = release_budget(cfg.privacy, cfg.mechanism, 1, domain=request_share(cfg, req))
    return planned.get("domain").event


def domain_spent(cfg, event: DomainEvent) -> dict:
    """What the DP domain step spends (``event`` alone, accounted as the release accounts it, at the release's delta):
    the ledger's charge for a run that stops after the step measured the data (a rerun would reveal a fresh output)."""
    from dpcda.mechanisms import registry
    from dpcda.privacy.accounting import ReleaseEvents, account
    from dpcda.privacy.composition import release_events_to_json

    mech = registry.get(cfg.mechanism.name)
    events = ReleaseEvents(cfg.mode, (event,), (), gaussian_draws=event.gaussian_draws)
    acc = account(
        events, cfg.delta, cross_check=False, relation=mech.relation(cfg.mode), accountant=mech.accountant or None
    )
    return {
        "epsilon": acc.epsilon,
        "delta": cfg.delta,
        "events": release_events_to_json(events),
        "note": "the DP domain step ran and the release stopped after it: its spend is charged, nothing published",
    }


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
    from dpcda.transforms.domain import DeriveDomain

    path = join(workdir, DOMAIN_FILE)
    schema = p | "DeriveDomain" >> DeriveDomain(files, req, event, key, share, expected_build=build)
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
