"""What a ledger holds: one entry per release of a dataset id (pending, published, exposed) and the dataset's stored
cap, each checked as it is read and before it is written (``entry_problem``): a row that cannot be used is refused,
never skipped, since skipping it would drop a release from the composed budget. The stores (``storage.ledger``) keep
entries; the privacy maths that composes them is ``privacy.composition``."""

from __future__ import annotations

import datetime
import json
import math
import re
import uuid
from typing import Optional

from dpcda.privacy.composition import Claim, LedgerError, claim_problem, release_events_from_json


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def new_run_id() -> str:
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{uuid.uuid4().hex[:8]}"


CAP = "cap"  # the state of the entry that holds a dataset's stored cap (not a release)
CAP_RUN = "(cap)"  # and its run


EXPOSED = "exposed"  # a run that failed on GCS after a part of it may have been readable: counts as pending, forever
STATES = ("pending", "published", EXPOSED, CAP)
_NUMBER = (int, float)


def entry_problem(entry) -> Optional[str]:
    """What makes ``entry`` (one decoded ledger row) unusable, or None. A row is refused, never skipped: skipping it
    would drop a release from the composed budget."""
    if not isinstance(entry, dict):
        return f"a JSON {type(entry).__name__}, not an entry"
    need = {"run": str, "dataset_id": str, "state": str}
    if entry.get("state") == CAP:
        need["epsilon"] = _NUMBER
    elif entry.get("state") in STATES:
        need.update(mode=str, relation=str, delta=_NUMBER)
    for field, kind in need.items():
        if field not in entry:
            return f"no '{field}'"
        if not isinstance(entry[field], kind) or isinstance(entry[field], bool):
            return f"'{field}' is a {type(entry[field]).__name__}"
    if entry["state"] not in STATES:
        return f"state '{entry['state'][:40]}' is none of {', '.join(STATES)}"
    if (entry["state"] == CAP) != (entry["run"] == CAP_RUN):
        return f"only the cap entry (run '{CAP_RUN}') has state '{CAP}'"
    eps = entry.get("epsilon")
    if entry["state"] == CAP:
        return None if _positive(eps) else "'epsilon' is not a positive finite number"
    if eps is not None and (not isinstance(eps, _NUMBER) or isinstance(eps, bool)):
        return f"'epsilon' is a {type(eps).__name__}"
    if eps is not None and not _positive(eps):  # null: no guarantee (counted as infinite)
        return "'epsilon' is not a positive finite number"
    if not (math.isfinite(entry["delta"]) and 0 <= entry["delta"] < 1):
        return "'delta' is not a finite number in [0, 1)"
    problem = claim_problem(claim_of(entry))  # known mode, a relation of that mode
    if problem is not None:
        return problem
    if entry["state"] == "published":
        return _events_problem(entry)
    return None


def _positive(eps) -> bool:
    return isinstance(eps, _NUMBER) and not isinstance(eps, bool) and math.isfinite(eps) and eps > 0


def _events_problem(entry: dict) -> Optional[str]:
    """A published entry's events must read back and hold at least one event of its own mode: an empty or truncated
    list would compose to less than the release spent."""
    try:
        events = release_events_from_json(entry.get("events"))
    except (LedgerError, KeyError, TypeError, ValueError, AttributeError, ZeroDivisionError):
        return "its privacy events do not read back"
    if events.mode != entry["mode"]:
        return "its privacy events are of another mode"
    if not (events.shared or events.per_class):
        return "it holds no privacy events"
    return None


def decode_entry(raw, uri: str, where: str, dataset_id: Optional[str] = None, run: Optional[str] = None) -> dict:
    """One stored row as an entry, or a LedgerError naming the ledger and the row (``where``; ``dataset_id`` and
    ``run``: the row's own columns, where the store has them)."""
    try:
        entry = json.loads(raw) if isinstance(raw, (str, bytes)) else raw
    except ValueError:
        entry, problem = None, "not valid JSON"
    else:
        problem = entry_problem(entry)
        if problem is None and dataset_id is not None and entry["dataset_id"] != dataset_id:
            problem = f"its entry names dataset '{entry['dataset_id'][:80]}'"
    if problem is None:
        return entry
    run = entry.get("run") if isinstance(entry, dict) and isinstance(entry.get("run"), str) else run
    who = f" (run '{run[:80]}')" if isinstance(run, str) else ""
    raise LedgerError(
        f"ledger {uri}: {where}{who} is corrupt ({problem}); nothing was read or changed. Restore the ledger from a "
        f"backup; a row is never skipped, since that would drop a release from the budget"
    )


def releases_of(entries: list[dict]) -> list[dict]:
    return [e for e in entries if e["state"] != CAP]


def stored_cap(entries: list[dict]) -> Optional[float]:
    caps = [e["epsilon"] for e in entries if e["state"] == CAP]
    return float(caps[-1]) if caps else None


def release_cap(entries: list[dict], requested: Optional[float], uri: str, dataset_id: str) -> Optional[float]:
    """The cap a release answers to: the dataset's stored cap; where none is stored, the release's own
    (``--budget-cap``), which the reservation then stores (``cap_entries``). A release that gives another cap than
    the stored one is refused: a stored cap changes only through ``dpcda ledger cap``, so a scheduled job's later
    runs, with or without the flag, answer to the cap its first run gave."""
    stored = stored_cap(entries)
    if stored is None or requested is None or requested == stored:
        return stored if stored is not None else requested
    raise LedgerError(
        f"ledger {uri}: dataset '{dataset_id}' has budget cap {stored:.17g} stored, and this release gives "
        f"--budget-cap {requested:.17g}; a stored cap changes only with 'dpcda ledger cap --ledger {uri} "
        f"--dataset-id {dataset_id} --epsilon E' (or leave the release's cap out to answer to the stored one); "
        f"nothing was changed"
    )


def cap_entries(entries: list[dict], requested: Optional[float], dataset_id: str) -> list[dict]:
    """``entries`` with the release's cap stored where the dataset has none yet (``release_cap`` decided it)."""
    if requested is None or stored_cap(entries) is not None:
        return entries
    return [*entries, _cap_entry(dataset_id, requested)]


def claim_of(entry: dict) -> Claim:
    eps = entry.get("epsilon")
    return Claim(
        run=entry["run"],
        mode=entry["mode"],
        relation=entry["relation"],
        epsilon=math.inf if eps is None else float(eps),
        delta=float(entry["delta"]),
        events=entry.get("events") if entry["state"] == "published" else None,
    )


DATASET_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._/:-]*$"  # the release's (schemas.config's dataset_id); a test checks
DATASET_ID_MAX = 200


def check_dataset_id(dataset_id) -> str:
    """The release's rule for dataset ids, for every ledger command: what a release refuses is never stored."""
    if not isinstance(dataset_id, str) or not (
        0 < len(dataset_id) <= DATASET_ID_MAX and re.fullmatch(DATASET_ID_PATTERN, dataset_id)
    ):
        raise LedgerError(
            f"dataset_id {dataset_id!r}: letters, digits and . _ / : - (starting with a letter or digit), at most "
            f"{DATASET_ID_MAX} characters"
        )
    return dataset_id


def check_cap(cap: Optional[float], what: str = "budget_cap") -> Optional[float]:
    """A cap is a positive finite epsilon (inf is no cap: leave the option out instead)."""
    if cap is not None and not (cap > 0 and math.isfinite(cap)):
        raise LedgerError(f"{what}: epsilon must be a positive finite number, got {cap}")
    return cap


def _cap_entry(dataset_id: str, epsilon: float) -> dict:
    return {"run": CAP_RUN, "dataset_id": dataset_id, "state": CAP, "epsilon": float(epsilon), "set_at": _now()}
