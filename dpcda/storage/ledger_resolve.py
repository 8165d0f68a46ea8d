"""What ``dpcda ledger show`` and ``dpcda ledger resolve`` do with a ledger's entries: a summary per dataset id, and
the decision on a reservation left by a run that died (recorded, exposed or dropped, from what OUTPUT holds)."""

from __future__ import annotations

import datetime
import json
from typing import Optional

from dpcda.privacy.composition import LedgerError, compose
from dpcda.storage.ledger_entries import EXPOSED, claim_of, releases_of, stored_cap
from dpcda.storage.paths import is_remote


def summary(ledger, dataset_id: Optional[str] = None) -> list[dict]:
    """Per dataset id: its entries and what they guarantee together (``dpcda ledger show``)."""
    entries = ledger.entries(dataset_id)
    out = []
    for ds in dict.fromkeys(e["dataset_id"] for e in entries):
        everything = [e for e in entries if e["dataset_id"] == ds]
        mine = releases_of(everything)
        try:
            with ledger._naming(ds):
                comp = compose([claim_of(e) for e in mine])
            total = {
                "epsilon": comp.epsilon,
                "delta": comp.delta,
                "sum_epsilon": comp.sum_epsilon,
                "relation": comp.relation,
                "method": comp.method,
            }
        except LedgerError as err:
            total = {"error": str(err)}
        out.append({"dataset_id": ds, "budget_cap": stored_cap(everything), "releases": mine, "composed": total})
    return out


# more than publish's clock-skew margin (24 h): a resolver whose clock runs ahead cannot drop a run still alive
RESOLVE_AFTER_HOURS = 48.0


def published_manifest(output: str, run: str) -> tuple[Optional[dict], Optional[dict]]:
    """(the manifest at OUTPUT if it names ledger run ``run``, else None; whatever manifest is at OUTPUT, or None if
    there is none). Read errors other than a missing manifest raise (OSError, ValueError)."""
    from dpcda.storage.paths import join, open_file

    try:
        with open_file(join(output, "manifest.json")) as fh:
            current = json.loads(fh.read())
    except FileNotFoundError:
        return None, None
    except Exception as err:  # gs://: google-cloud's NotFound (404) is not a FileNotFoundError
        if is_remote(output) and getattr(err, "code", None) == 404:
            return None, None
        raise
    ours = current if (current.get("ledger") or {}).get("run") == run else None
    return ours, current


def resolve(ledger, dataset_id: str, run: str, *, force: bool = False, drop: bool = False) -> str:
    """A reservation left by a run that died: 'recorded' if OUTPUT holds the run's release (its manifest names the
    run); on gs:// 'exposed' otherwise (its parts may have been readable), unless ``drop``; 'dropped' only on
    evidence that the run published nothing (no manifest at OUTPUT, or one made before the run reserved its budget)
    or with ``drop``; 'charged' instead of 'dropped' when the run's DP domain step had started (what that step
    spends is recorded: ``Ledger.will_charge``). Refuses while the run may still be going: OUTPUT's lock is held, or
    the reservation is younger than RESOLVE_AFTER_HOURS (``force`` overrides the age, never the lock)."""
    from dpcda.storage.publish import output_busy

    found = [e for e in releases_of(ledger.entries(dataset_id)) if e["run"] == run]
    if not found:
        raise LedgerError(f"ledger {ledger.uri}: dataset '{dataset_id}' has no run {run}")
    entry = found[0]
    if entry["state"] == EXPOSED:
        raise LedgerError(
            f"ledger {ledger.uri}: run {run} failed after a part of it may have been readable on GCS; it keeps "
            f"counting at its target epsilon and cannot be resolved"
        )
    if entry["state"] != "pending":
        raise LedgerError(f"ledger {ledger.uri}: run {run} is already recorded as published")
    reserved = datetime.datetime.fromisoformat(entry["reserved_at"])
    age = (datetime.datetime.now(datetime.timezone.utc) - reserved).total_seconds() / 3600
    if output_busy(entry["output"]):
        raise LedgerError(f"ledger: a release to {entry['output']} holds its lock: run {run} may still be going")
    if age < RESOLVE_AFTER_HOURS and not force:
        raise LedgerError(
            f"ledger: run {run} reserved {age:.1f} h ago and may still be running; pass --force if it is known to "
            f"have stopped"
        )
    try:
        ours, current = published_manifest(entry["output"], run)
    except Exception as err:  # noqa: BLE001 - OSError, bad JSON, google-cloud's Forbidden...: one line, no change
        why = str(err).splitlines()[0][:200] if str(err) else ""
        raise LedgerError(
            f"ledger: cannot read {entry['output']}/manifest.json ({type(err).__name__}{': ' + why if why else ''}); "
            f"nothing changed"
        ) from None
    if ours is not None:
        ledger.record(dataset_id, run, ours)
        return "recorded"
    if is_remote(entry["output"]) and not drop:  # its parts sat under OUTPUT/runs/<run>/, which readers may list
        ledger.expose(dataset_id, run)
        return EXPOSED
    made = (current or {}).get("created_at")
    older = made is not None and datetime.datetime.fromisoformat(made) < reserved
    if current is None or older or drop:
        ledger.cancel(dataset_id, run)  # a run whose DP domain step had started is charged that step, not dropped
        return "charged" if entry.get("charge_on_failure") else "dropped"
    raise LedgerError(
        f"ledger: {entry['output']} holds a release made after run {run} reserved its budget, by another run; run "
        f"{run} may have been published and then replaced. Pass --drop only if you know it was not published"
    )
