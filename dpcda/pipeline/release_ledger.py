"""A release's privacy ledger around its run: the reservation written before any data is read, the settling of a run
that raised (decided by what OUTPUT holds), and the record of a published one (docs/operations.md, "The privacy
ledger")."""

from __future__ import annotations

import dataclasses
import logging

from dpcda.pipeline.errors import ReleaseError
from dpcda.schemas.config import ReleaseConfig
from dpcda.schemas.manifest import Manifest
from dpcda.storage import publish

log = logging.getLogger("dpcda.release")


@dataclasses.dataclass
class Reservation:
    """A run's reservation in ``cfg.ledger``: the ledger, the run's id, what was reserved (``request``) and the
    manifest's ledger section."""

    ledger: object
    run: str
    request: dict
    section: object


def reserve(cfg: ReleaseConfig) -> Reservation:
    """Opens ``cfg.ledger`` and reserves the release's budget under a new run id, before any data is read."""
    from dpcda.privacy.accounting import relation_key
    from dpcda.storage.ledger import new_run_id, open_ledger

    ledger = open_ledger(cfg.ledger)
    run = new_run_id()
    request = {
        "run": run,
        "mechanism": cfg.mechanism.name,
        "mode": cfg.mode,
        "relation": relation_key(cfg.mechanism.name, cfg.mode),
        "epsilon": cfg.epsilon,
        "delta": cfg.delta,
        "output": publish.check_output_path(cfg.output),  # one spelling, whatever the working directory
    }
    section = ledger.reserve(cfg.dataset_id, request, cfg.budget_cap)
    return Reservation(ledger, run, request, section)


def settle(ledger, dataset_id: str, request: dict, err: BaseException) -> None:
    """The reservation of a run that raised, decided by what OUTPUT holds (not by where the exception came from: an
    interrupt can land after the release became visible): recorded if OUTPUT's manifest names the run, removed if
    it does not. Anything that goes wrong here (a second interrupt, an unreachable ledger, an unreadable OUTPUT)
    leaves the reservation, which keeps counting at the target epsilon, and the original error stands."""
    from dpcda.storage.ledger_resolve import published_manifest

    run, output = request["run"], request["output"]
    try:
        ours, _ = published_manifest(output, run)
        if ours is not None:
            err.published = True
            ledger.record(dataset_id, run, ours)
        elif publish.exposed_in(err):
            ledger.expose(dataset_id, run, request)  # entered again if its reservation was dropped meanwhile
        elif getattr(err, "domain_spent", None) is not None:  # the DP domain step measured the data: charged
            ledger.charge(dataset_id, run, err.domain_spent)
        else:
            ledger.cancel(dataset_id, run)
    except BaseException as inner:  # noqa: BLE001 - never hide the release's own error
        log.error("stage=ledger run=%s: reservation left as it is (%s: %s)", run, type(inner).__name__, inner)


def _record(ledger, dataset_id: str, run: str, manifest: Manifest) -> bool:
    """Records a published release; False (logged) when the ledger cannot be written: the reservation then stays."""
    try:
        ledger.record(dataset_id, run, manifest.model_dump(mode="json"))
        return True
    except Exception as err:  # noqa: BLE001 - the release is out; the reservation keeps the ledger conservative
        log.error("stage=ledger run=%s could not be recorded (%s); its reservation stays", run, err)
        return False


def record_published(cfg: ReleaseConfig, reservation: Reservation, manifest: Manifest) -> None:
    """Records the published ``manifest`` against its reservation. Where the ledger cannot be written, or an interrupt
    lands while it is (its transaction rolls back), the reservation stays and keeps counting at the target epsilon:
    the error raised carries ``published = True`` and says how to resolve it."""
    run = reservation.run
    resolve = (
        f"its reservation (run {run}) counts at the target epsilon until 'dpcda ledger resolve --ledger {cfg.ledger} "
        f"--dataset-id {cfg.dataset_id} --run {run}'"
    )
    try:
        recorded = _record(reservation.ledger, cfg.dataset_id, run, manifest)
    except BaseException as err:  # an interrupt while recording
        err.published = True
        err.ledger_note = f"the ledger {cfg.ledger} has not recorded it: {resolve}"
        raise
    if not recorded:
        err = ReleaseError(
            f"the release WAS published at {cfg.output}, but the ledger {cfg.ledger} could not record it; {resolve}"
        )
        err.published = True
        raise err
