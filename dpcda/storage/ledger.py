"""The release ledger: every release of a dataset id, kept in a local SQLite file or one gs:// object.

A release reserves its budget before it reads any data (``reserve``: the history and the new release's target are
composed by ``privacy.composition`` and checked against the cap in the same transaction that writes the
reservation), and is recorded with its stated guarantee and DP events once published (``record``). A release that
fails or is interrupted before publishing removes its reservation (``cancel``); one that died without a word leaves
it, and it keeps counting at its target epsilon (never less than it spent) until ``dpcda ledger resolve`` records or
drops it. On a gs:// OUTPUT a run's parts sit under ``OUTPUT/runs/<run>/`` before the manifest commits them, where
readers who may list the bucket can copy them: a run that fails after a part may have been readable is not
cancelled but marked ``exposed`` (``publish.exposed_on_gcs``), and counts at its target epsilon for good; ``resolve``
marks a dead GCS run ``exposed`` too, unless ``--drop`` says that nothing of it was readable.

A ledger is created once (``dpcda ledger init``): a release or ``ledger show`` refuses a ledger that does not exist,
so a mistyped path never starts an empty budget. ``dpcda ledger cap`` stores a dataset's cap in the ledger; a
release's ``--budget-cap`` can only lower it. Writes are idempotent (a retried reserve or record after a lost
response changes nothing twice).

Races. Two releases racing on one ledger cannot both pass a cap that only one fits: SQLite takes its write lock
(``BEGIN IMMEDIATE``) before reading the history; on GCS the ledger object is rewritten with ``if_generation_match``
set to the generation that was read, and a writer that lost the race reads again and decides again.
"""

from __future__ import annotations

import abc
import contextlib
import datetime
import json
import logging
import math
import os
import random
import sqlite3
import time
import uuid
from typing import Callable, Optional

from dpcda.privacy.accounting import relation_key
from dpcda.privacy.composition import (
    Claim,
    ClaimError,
    LedgerError,
    check_budget,
    claim_problem,
    compose,
    release_events_from_json,
)
from dpcda.storage.paths import is_remote

log = logging.getLogger("dpcda.ledger")
FORMAT = "dpcda-ledger/1"
GCS_ATTEMPTS = 50

# fn(entries of one dataset id) -> (new entries of that dataset id, result)
Transaction = Callable[[list[dict]], tuple[list[dict], object]]


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


def effective_cap(entries: list[dict], requested: Optional[float]) -> Optional[float]:
    """The stored cap, lowered (never raised) by the release's --budget-cap."""
    caps = [c for c in (stored_cap(entries), requested) if c is not None]
    return min(caps) if caps else None


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


class Ledger(abc.ABC):
    """Reserve, record, cancel and list releases; subclasses supply one atomic read-modify-write."""

    uri: str

    @abc.abstractmethod
    def _transact(self, dataset_id: str, fn: Transaction):
        """Runs ``fn`` on the dataset's entries and stores what it returns, atomically; returns fn's result."""

    @abc.abstractmethod
    def entries(self, dataset_id: Optional[str] = None) -> list[dict]:
        """Every entry (of ``dataset_id``), in the order they were written."""

    def reserve(self, dataset_id: str, request: dict, cap: Optional[float]) -> dict:
        """Composes the history with ``request`` (run, mechanism, mode, relation, epsilon, delta, output) and writes
        a reservation if the result fits the cap (the stored one, lowered by ``cap``); returns the manifest's
        ``ledger`` section. Raises LedgerError. Idempotent: a run already on the ledger is not added again."""
        check_dataset_id(dataset_id)
        check_cap(cap)  # --budget-cap inf is refused, as ledger cap --epsilon inf is
        entry = {**request, "dataset_id": dataset_id, "state": "pending", "reserved_at": _now(), "events": None}

        def fn(entries):
            history = [e for e in releases_of(entries) if e["run"] != request["run"]]
            limit = effective_cap(entries, cap)
            with self._naming(dataset_id):
                figures = check_budget(dataset_id, [claim_of(e) for e in history], claim_of(entry), limit)
            if any(e["run"] == request["run"] for e in entries):
                return entries, figures  # a retry after a lost response: already reserved
            return [*entries, entry], figures

        figures = self._transact(dataset_id, fn)
        log.info(
            "stage=ledger dataset=%s run=%s reserved epsilon=%s (before %.4g, after at most %.4g, cap %s)",
            dataset_id,
            request["run"],
            request["epsilon"],
            figures["before"]["epsilon"],
            figures["after_at_most"]["epsilon"],
            figures["budget_cap"],
        )
        return {"uri": self.uri, "dataset_id": dataset_id, "run": request["run"], **figures}

    def record(self, dataset_id: str, run: str, manifest: dict) -> None:
        """The published release's stated guarantee and events replace its reservation (idempotent)."""
        p = manifest["privacy"]
        published = {
            "state": "published",
            "epsilon": p["epsilon"],
            "delta": p["delta"],
            "events": p.get("events"),
            "published_at": _now(),
            "prefix": manifest.get("output", {}).get("prefix", ""),
        }

        def checked(entry: dict) -> dict:  # never write a row that the next read would refuse
            problem = entry_problem(entry)
            if problem is not None:
                raise LedgerError(
                    f"ledger {self.uri}: run {run}: the release's manifest cannot be recorded ({problem}); its "
                    f"reservation stays and counts at its target epsilon"
                )
            return entry

        def fn(entries):
            for e in entries:
                if e["run"] == run and e["state"] == "published":
                    return entries, None  # recorded already (a retry after a lost response)
                if e["run"] == run and e["state"] in ("pending", EXPOSED):
                    checked({**e, **published})
                    e.update(published)
                    return entries, None
            # its reservation was dropped (``resolve --drop`` while it ran): what was published is recorded anyway
            log.warning("stage=ledger run=%s had no reservation; recording the published release", run)
            mech = manifest.get("mechanism", {})
            entry = {
                "run": run,
                "dataset_id": dataset_id,
                "mechanism": mech.get("name"),
                "mode": mech.get("mode"),
                "relation": relation_key(mech.get("name", "dpcda"), mech.get("mode", "fixed")),
                "output": None,
                "reserved_at": None,
                **published,
            }
            return [*entries, checked(entry)], None

        self._transact(dataset_id, fn)
        log.info("stage=ledger dataset=%s run=%s recorded epsilon=%s", dataset_id, run, p["epsilon"])

    def cancel(self, dataset_id: str, run: str) -> None:
        """Removes a reservation (never a published entry)."""

        def fn(entries):
            return [e for e in entries if not (e["run"] == run and e["state"] == "pending")], None

        self._transact(dataset_id, fn)

    def expose(self, dataset_id: str, run: str, request: Optional[dict] = None) -> str:
        """A reservation whose run failed after a part of it may have been readable (GCS): it is never cancelled
        and keeps counting at its target epsilon (idempotent; a published entry stays as it is). Where the run has
        no entry any more (``ledger resolve --drop`` removed it while the run lived), ``request`` (what the run
        reserved: run, mechanism, mode, relation, epsilon, delta, output) is entered again as exposed. Returns what
        happened: 'exposed', 'already exposed', 'published' (unchanged), 'added' or 'missing' (no entry, no request)."""

        def fn(entries):
            for e in entries:
                if e["run"] == run and e["state"] == "pending":
                    e.update(state=EXPOSED, exposed_at=_now())
                    return entries, "exposed"
                if e["run"] == run and e["state"] in (EXPOSED, "published"):
                    return entries, "already exposed" if e["state"] == EXPOSED else "published"
            if request is None:
                return entries, "missing"
            entry = {**request, "run": run, "dataset_id": dataset_id, "state": EXPOSED, "reserved_at": None}
            entry.update(events=None, exposed_at=_now())
            problem = entry_problem(entry)
            if problem is not None:
                raise LedgerError(f"ledger {self.uri}: run {run} cannot be entered again as exposed ({problem})")
            return [*entries, entry], "added"

        done = self._transact(dataset_id, fn)
        what = {
            "exposed": "its reservation keeps counting at its target epsilon",
            "already exposed": "it was already counted as exposed",
            "published": "it is recorded as published; unchanged",
            "added": "its reservation had been dropped; it is entered again and counts at its target epsilon",
            "missing": "it has NO entry on the ledger and nothing is counted for it; add it back by hand",
        }[done]
        (log.error if done == "missing" else log.warning)(
            "stage=ledger dataset=%s run=%s: a part may have been readable before the run failed; %s",
            dataset_id,
            run,
            what,
        )
        return done

    @contextlib.contextmanager
    def _naming(self, dataset_id: str):
        """A row that cannot be composed, as one line naming the ledger and the row."""
        try:
            yield
        except ClaimError as err:
            raise LedgerError(
                f"ledger {self.uri}: dataset '{dataset_id}', run '{err.run[:80]}': {err.problem}; nothing was "
                f"changed. Restore the ledger from a backup"
            ) from None

    def set_cap(self, dataset_id: str, epsilon: float) -> None:
        """Stores the dataset's budget cap (``dpcda ledger cap``); a release's --budget-cap can only lower it."""
        check_dataset_id(dataset_id)
        check_cap(epsilon, "ledger cap")

        def fn(entries):
            return [*(e for e in entries if e["state"] != CAP), _cap_entry(dataset_id, epsilon)], None

        self._transact(dataset_id, fn)


DATASET_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._/:-]*$"  # the release's (schemas.config's dataset_id); a test checks
DATASET_ID_MAX = 200


def check_dataset_id(dataset_id) -> str:
    """The release's rule for dataset ids, for every ledger command: what a release refuses is never stored."""
    import re

    if not isinstance(dataset_id, str) or not (
        0 < len(dataset_id) <= DATASET_ID_MAX and re.match(DATASET_ID_PATTERN, dataset_id)
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


class SqliteLedger(Ledger):
    """One row per release; a transaction takes the write lock before it reads."""

    def __init__(self, path: str, *, create: bool = False):
        self.uri = path
        parent = os.path.dirname(os.path.abspath(path))
        if path in ("", ":memory:") or path.startswith("file:"):
            raise LedgerError(f"ledger {path!r}: name a file")
        if not os.path.isdir(parent):
            raise LedgerError(f"ledger {path}: folder {parent} does not exist")
        if os.path.exists(path) and not os.path.isfile(path):
            raise LedgerError(f"ledger {path}: not a regular file")
        if not os.path.exists(path) and not create:
            raise LedgerError(
                f"ledger {path}: does not exist (create it once with 'dpcda ledger init --ledger {path}')"
            )
        if create and not os.path.exists(path) and path.lower().endswith(".json"):
            raise LedgerError(
                f"ledger {path}: a local ledger is a SQLite file, not JSON; name it e.g. "
                f"{path[: -len('.json')]}.db (a .json ledger is the one-object form on gs://)"
            )
        try:
            with contextlib.closing(self._connect()) as conn:
                tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
                if create and tables - {"releases", "sqlite_sequence"}:
                    raise LedgerError(
                        f"ledger {path}: a SQLite file of something else (tables {', '.join(sorted(tables))}); "
                        f"refusing to add a ledger to it"
                    )
                if create:
                    conn.execute(
                        "CREATE TABLE IF NOT EXISTS releases (seq INTEGER PRIMARY KEY AUTOINCREMENT, dataset_id TEXT "
                        "NOT NULL, run TEXT NOT NULL, entry TEXT NOT NULL, UNIQUE (dataset_id, run))"
                    )
                cols = [r[1] for r in conn.execute("PRAGMA table_info(releases)")]
        except sqlite3.Error as err:
            raise LedgerError(f"ledger {path}: not a ledger SQLite file ({err})") from None
        if cols != ["seq", "dataset_id", "run", "entry"]:
            raise LedgerError(f"ledger {path}: holds no ledger ('releases' table with columns {cols})")

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.uri, timeout=120, isolation_level=None)

    def _transact(self, dataset_id: str, fn: Transaction):
        try:
            return self._transact_once(dataset_id, fn)
        except sqlite3.Error as err:  # e.g. still locked after the timeout, a read-only file
            raise LedgerError(f"ledger {self.uri}: {err}") from None

    def _transact_once(self, dataset_id: str, fn: Transaction):
        conn = self._connect()
        try:
            conn.execute("BEGIN IMMEDIATE")  # the write lock first: no other writer reads the history meanwhile
            rows = conn.execute(
                "SELECT seq, dataset_id, entry, run FROM releases WHERE dataset_id = ? ORDER BY seq", (dataset_id,)
            )
            entries = [decode_entry(r[2], self.uri, f"row {r[0]}", r[1], r[3]) for r in rows]
            new, result = fn(entries)
            conn.execute("DELETE FROM releases WHERE dataset_id = ?", (dataset_id,))
            conn.executemany(
                "INSERT INTO releases (dataset_id, run, entry) VALUES (?, ?, ?)",
                [(dataset_id, e["run"], json.dumps(e, allow_nan=False)) for e in new],
            )
            conn.execute("COMMIT")
            return result
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        finally:
            conn.close()

    def entries(self, dataset_id: Optional[str] = None) -> list[dict]:
        try:
            with contextlib.closing(self._connect()) as conn:
                if dataset_id is None:
                    rows = conn.execute("SELECT seq, dataset_id, entry, run FROM releases ORDER BY seq")
                else:
                    rows = conn.execute(
                        "SELECT seq, dataset_id, entry, run FROM releases WHERE dataset_id = ? ORDER BY seq",
                        (dataset_id,),
                    )
                return [decode_entry(r[2], self.uri, f"row {r[0]}", r[1], r[3]) for r in rows]
        except sqlite3.Error as err:
            raise LedgerError(f"ledger {self.uri}: {err}") from None


class GcsLedger(Ledger):
    """One JSON object; every change rewrites it with a generation precondition and retries when it lost a race."""

    def __init__(self, uri: str, *, create: bool = False):
        from dpcda.storage.publish import gcs_client, split_gs

        self.uri = uri
        bucket, self.name = split_gs(uri)
        if not self.name:
            raise LedgerError(f"ledger {uri}: name an object, e.g. gs://bucket/ledgers/privacy.json")
        with _gcs_errors(uri):  # no credentials is one line too
            self.bucket = gcs_client().bucket(bucket)
            exists = self.bucket.get_blob(self.name) is not None
            if create and not exists:
                text = json.dumps({"format": FORMAT, "entries": []})
                self.bucket.blob(self.name).upload_from_string(
                    text, content_type="application/json", if_generation_match=0
                )
            elif not exists:
                raise LedgerError(
                    f"ledger {uri}: does not exist (create it once with 'dpcda ledger init --ledger {uri}')"
                )
        self._read()  # a readable ledger object, or one line saying what it is instead

    def _read(self) -> Optional[tuple[list[dict], int]]:
        """(entries, generation) of the object as one consistent read; None when it changed meanwhile (read again)."""
        from google.api_core import exceptions as gexc

        blob = self.bucket.get_blob(self.name)
        if blob is None:
            raise LedgerError(f"ledger {self.uri}: the ledger object is gone")
        generation = int(blob.generation)
        try:  # the content of that generation, or a stale read to retry
            raw = blob.download_as_bytes(if_generation_match=generation)
        except (gexc.NotFound, gexc.PreconditionFailed):
            return None
        try:
            data = json.loads(raw)
        except ValueError:
            raise LedgerError(f"ledger {self.uri}: not valid JSON") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("entries", []), list):
            raise LedgerError(f"ledger {self.uri}: not a ledger object (format {FORMAT} expected)")
        entries = [decode_entry(e, self.uri, f"entry {i}") for i, e in enumerate(data.get("entries", []), 1)]
        return entries, generation

    def _transact(self, dataset_id: str, fn: Transaction):
        from google.api_core import exceptions as gexc

        with _gcs_errors(self.uri):
            for attempt in range(GCS_ATTEMPTS):
                read = self._read()
                if read is not None:
                    everything, generation = read
                    mine = [e for e in everything if e["dataset_id"] == dataset_id]
                    new, result = fn([dict(e) for e in mine])
                    others = [e for e in everything if e["dataset_id"] != dataset_id]
                    text = json.dumps({"format": FORMAT, "entries": [*others, *new]}, indent=1, allow_nan=False)
                    try:
                        self.bucket.blob(self.name).upload_from_string(
                            text, content_type="application/json", if_generation_match=generation
                        )
                        return result
                    except gexc.PreconditionFailed:  # another writer got there first (or our own retried write
                        pass  # did: fn is idempotent, so deciding again on what is there now is right either way)
                _pause(attempt)
        raise LedgerError(f"ledger {self.uri}: still contended after {GCS_ATTEMPTS} attempts; try again")

    def entries(self, dataset_id: Optional[str] = None) -> list[dict]:
        with _gcs_errors(self.uri):
            for attempt in range(GCS_ATTEMPTS):
                read = self._read()
                if read is not None:
                    return [e for e in read[0] if dataset_id is None or e["dataset_id"] == dataset_id]
                _pause(attempt)
        raise LedgerError(f"ledger {self.uri}: still changing after {GCS_ATTEMPTS} reads; try again")


def _pause(attempt: int) -> None:
    """Back-off with jitter before reading the ledger object again (no private data involved)."""
    time.sleep(random.uniform(0.05, 0.2) * (1 + attempt))


@contextlib.contextmanager
def _gcs_errors(uri: str):
    """google-cloud errors (no such bucket, permission, credentials) as one LedgerError line."""
    from google.api_core import exceptions as gexc
    from google.auth import exceptions as auth_exc

    try:
        yield
    except (gexc.GoogleAPIError, auth_exc.GoogleAuthError) as err:
        raise LedgerError(f"ledger {uri}: {type(err).__name__}: {str(err).splitlines()[0][:200]}") from None


def open_ledger(uri: str, *, create: bool = False) -> Ledger:
    """The ledger at ``uri``; LedgerError if it does not exist, unless ``create`` (``dpcda ledger init``)."""
    if is_remote(uri):
        if not uri.startswith("gs://"):
            raise LedgerError(f"ledger {uri}: a local SQLite file or gs://bucket/object")
        return GcsLedger(uri, create=create)
    return SqliteLedger(uri, create=create)


def summary(ledger: Ledger, dataset_id: Optional[str] = None) -> list[dict]:
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


RESOLVE_AFTER_HOURS = 24.0


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


def resolve(ledger: Ledger, dataset_id: str, run: str, *, force: bool = False, drop: bool = False) -> str:
    """A reservation left by a run that died: 'recorded' if OUTPUT holds the run's release (its manifest names the
    run); on gs:// 'exposed' otherwise (its parts may have been readable), unless ``drop``; 'dropped' only on
    evidence that the run published nothing (no manifest at OUTPUT, or one made before the run reserved its budget)
    or with ``drop``. Refuses while the run may still be going: OUTPUT's lock is held, or
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
        ledger.cancel(dataset_id, run)
        return "dropped"
    raise LedgerError(
        f"ledger: {entry['output']} holds a release made after run {run} reserved its budget, by another run; run "
        f"{run} may have been published and then replaced. Pass --drop only if you know it was not published"
    )
