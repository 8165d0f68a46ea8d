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
so a mistyped path never starts an empty budget. A dataset's cap is stored in the ledger by ``dpcda ledger cap``, or
by the first release that gives ``--budget-cap`` (with its reservation, in one transaction); every later release
answers to it, with or without the flag, and one that gives another cap is refused. Writes are idempotent (a retried
reserve or record after a lost response changes nothing twice).

Races. Two releases racing on one ledger cannot both pass a cap that only one fits: SQLite takes its write lock
(``BEGIN IMMEDIATE``) before reading the history; on GCS the ledger object is rewritten with ``if_generation_match``
set to the generation that was read, and a writer that lost the race reads again and decides again.
"""

from __future__ import annotations

import abc
import contextlib
import json
import logging
import os
import random
import sqlite3
import time
from typing import Callable, Optional

from dpcda.privacy.accounting import relation_key
from dpcda.privacy.composition import ClaimError, LedgerError, check_budget
from dpcda.storage.ledger_entries import (  # noqa: F401 - the entries' names, as the stores' users know them
    CAP,
    CAP_RUN,
    DATASET_ID_MAX,
    DATASET_ID_PATTERN,
    EXPOSED,
    STATES,
    _cap_entry,
    _now,
    cap_entries,
    check_cap,
    check_dataset_id,
    claim_of,
    decode_entry,
    entry_problem,
    new_run_id,
    release_cap,
    releases_of,
    stored_cap,
)
from dpcda.storage.ledger_resolve import published_manifest, resolve, summary  # noqa: F401 - the commands' names
from dpcda.storage.paths import is_remote

log = logging.getLogger("dpcda.ledger")
FORMAT = "dpcda-ledger/1"
GCS_ATTEMPTS = 50
# A SQLite ledger locked by another process: a release says at once that it waits, and gives up after this long
# (the lock is held for one reservation or record; a holder that keeps it longer is not a release)
LOCK_WAIT_SECONDS = 120
BUSY_PROBE_SECONDS = 0.5

# fn(entries of one dataset id) -> (new entries of that dataset id, result)
Transaction = Callable[[list[dict]], tuple[list[dict], object]]


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
        a reservation if the result fits the dataset's cap; returns the manifest's ``ledger`` section. The cap is the
        stored one; where none is stored yet, ``cap`` (the release's ``--budget-cap``) is, in the same transaction
        as the reservation, so of two first releases with different caps exactly one cap is stored and the other
        release, finding it, is refused (``ledger_entries.release_cap``). Raises LedgerError, changing nothing but the
        cap: a release refused for the budget still stores the cap it gives where none was stored.
        Idempotent: a run already on the ledger is not added again."""
        check_dataset_id(dataset_id)
        check_cap(cap)  # --budget-cap inf is refused, as ledger cap --epsilon inf is
        entry = {**request, "dataset_id": dataset_id, "state": "pending", "reserved_at": _now(), "events": None}

        def fn(entries):
            history = [e for e in releases_of(entries) if e["run"] != request["run"]]
            limit = release_cap(entries, cap, self.uri, dataset_id)  # a different cap: refused, nothing stored
            capped = cap_entries(entries, cap, dataset_id)
            try:
                with self._naming(dataset_id):
                    figures = check_budget(dataset_id, [claim_of(e) for e in history], claim_of(entry), limit)
            except LedgerError as refused:
                if capped is entries:
                    raise  # no cap to store: nothing is written
                # the cap this release gives is the dataset's from now on, though the release itself is refused: a
                # scheduler's next run without the flag answers to it (nothing else is written)
                return capped, refused
            if any(e["run"] == request["run"] for e in entries):
                return capped, figures  # a retry after a lost response: already reserved
            return [*capped, entry], figures

        figures = self._transact(dataset_id, fn)
        if isinstance(figures, LedgerError):
            raise figures
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
        """Removes a reservation (never a published entry). A reservation marked ``charge_on_failure`` (its run's DP
        domain step was about to measure the data: ``will_charge``) is not removed but charged what that step spends,
        whoever cancels it (the run's own clean-up, a second interrupt's, or ``ledger resolve`` after a run that died
        without a word)."""
        marked = {}

        def fn(entries):
            for e in entries:
                if e["run"] == run and e["state"] == "pending" and e.get("charge_on_failure"):
                    marked["spent"] = e["charge_on_failure"]
                    return entries, None
            return [e for e in entries if not (e["run"] == run and e["state"] == "pending")], None

        self._transact(dataset_id, fn)
        if marked:
            self.charge(dataset_id, run, marked["spent"])

    def will_charge(self, dataset_id: str, run: str, spent: dict) -> None:
        """Marks a run's reservation, in one transaction and before its DP domain step reads any row, with what that
        step spends (``spent``: epsilon, delta, events, note): from then on a cancel charges it instead of removing
        it (``cancel``). Raises if the reservation is not there to mark (the run then stops before reading)."""

        def fn(entries):
            for e in entries:
                if e["run"] == run and e["state"] == "pending":
                    e["charge_on_failure"] = spent
                    return entries, True
            return entries, False

        if not self._transact(dataset_id, fn):
            raise LedgerError(f"ledger {self.uri}: run {run} has no reservation to mark before its DP domain step")

    def charge(self, dataset_id: str, run: str, spent: dict) -> None:
        """A run that failed after a DP step measured its data (the DP domain step, whose output a rerun would reveal
        afresh): its reservation is replaced by what that step spent (``spent``: epsilon, delta, events, note),
        recorded as a release of its own that publishes nothing (idempotent; a published entry stays as it is).
        Where the run has no entry any more, nothing is added (``ledger resolve --drop`` removed it on purpose)."""
        charged = {
            "state": "published",
            "epsilon": spent["epsilon"],
            "delta": spent["delta"],
            "events": spent["events"],
            "published_at": _now(),
            "prefix": "",
            "note": spent["note"],
        }

        def fn(entries):
            for e in entries:
                if e["run"] == run and e["state"] in ("pending", EXPOSED):
                    if e["state"] == EXPOSED:  # counts at its target for good: more than the step spent
                        return entries, "exposed"
                    problem = entry_problem({**e, **charged})
                    if problem is not None:
                        raise LedgerError(f"ledger {self.uri}: run {run}: its spend cannot be recorded ({problem})")
                    e.update(charged)
                    e.pop("charge_on_failure", None)
                    return entries, "charged"
            return entries, "missing"

        done = self._transact(dataset_id, fn)
        log.warning(
            "stage=ledger dataset=%s run=%s failed after its DP domain step measured the data: %s (epsilon %.4g)",
            dataset_id,
            run,
            {
                "charged": "that step's spend is recorded",
                "exposed": "it keeps counting at its target epsilon",
                "missing": "it has no entry; nothing recorded",
            }[done],  # fmt: skip
            spent["epsilon"],
        )

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
        """Stores the dataset's budget cap (``dpcda ledger cap``), replacing a stored one: the only way to change it
        (a release that gives another cap is refused)."""
        check_dataset_id(dataset_id)
        check_cap(epsilon, "ledger cap")

        def fn(entries):
            return [*(e for e in entries if e["state"] != CAP), _cap_entry(dataset_id, epsilon)], None

        self._transact(dataset_id, fn)


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

        def schema(conn):
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
            return [r[1] for r in conn.execute("PRAGMA table_info(releases)")]

        try:
            cols = self._waiting(schema)
        except sqlite3.Error as err:  # a busy ledger is said so (``_waiting``), never called "not a ledger"
            raise LedgerError(f"ledger {path}: not a ledger SQLite file ({err})") from None
        if cols != ["seq", "dataset_id", "run", "entry"]:
            raise LedgerError(f"ledger {path}: holds no ledger ('releases' table with columns {cols})")

    def _waiting(self, op):
        """``op(connection)``, waiting for the file's lock while another process holds it: at once where it is free;
        otherwise a log line says the ledger is busy (and who holds it, where the system tells), and the wait goes
        on up to LOCK_WAIT_SECONDS before a LedgerError that says so. ``op`` is retried whole: a transaction that met
        the lock was rolled back (``_transact_once``)."""
        for waited, timeout in enumerate((BUSY_PROBE_SECONDS, LOCK_WAIT_SECONDS)):
            if waited:
                who = _lock_holders(self.uri)
                log.warning(
                    "stage=ledger ledger %s is busy (its lock is held%s); waiting up to %d s",
                    self.uri,
                    f" by process {', '.join(map(str, who))}" if who else "",
                    LOCK_WAIT_SECONDS,
                )
            try:
                with contextlib.closing(sqlite3.connect(self.uri, timeout=timeout, isolation_level=None)) as conn:
                    return op(conn)
            except sqlite3.OperationalError as err:
                if not _busy(err):
                    raise
        who = _lock_holders(self.uri)
        raise LedgerError(  # busy, not damaged: never worded as a bad ledger
            f"ledger {self.uri}: busy: another process{' (' + ', '.join(map(str, who)) + ')' if who else ''} holds its "
            f"lock and did not let go within {LOCK_WAIT_SECONDS} s; nothing was read or changed. The ledger is not "
            f"damaged: try again once that process has finished"
        )

    def _transact(self, dataset_id: str, fn: Transaction):
        try:
            return self._waiting(lambda conn: self._transact_once(conn, dataset_id, fn))
        except sqlite3.Error as err:  # e.g. a read-only file
            raise LedgerError(f"ledger {self.uri}: {err}") from None

    def _transact_once(self, conn: sqlite3.Connection, dataset_id: str, fn: Transaction):
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

    def entries(self, dataset_id: Optional[str] = None) -> list[dict]:
        def read(conn):
            if dataset_id is None:
                rows = conn.execute("SELECT seq, dataset_id, entry, run FROM releases ORDER BY seq")
            else:
                rows = conn.execute(
                    "SELECT seq, dataset_id, entry, run FROM releases WHERE dataset_id = ? ORDER BY seq", (dataset_id,)
                )
            return [decode_entry(r[2], self.uri, f"row {r[0]}", r[1], r[3]) for r in rows]

        try:
            return self._waiting(read)
        except sqlite3.Error as err:
            raise LedgerError(f"ledger {self.uri}: {err}") from None


# SQLite's result codes for a lock held by another connection
_SQLITE_BUSY, _SQLITE_LOCKED = 5, 6


def _busy(err: sqlite3.OperationalError) -> bool:
    code = getattr(err, "sqlite_errorcode", None)
    return (code is not None and code & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED)) or "database is locked" in str(err)


def _lock_holders(path: str) -> list[int]:
    """The processes that hold a lock on ``path`` (Linux's /proc/locks; SQLite locks the file with fcntl); [] where
    the system does not say. Never this process."""
    try:
        st = os.stat(path)
        with open("/proc/locks") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return []
    me = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    found = []
    for line in lines:
        parts = line.split()
        if "->" in parts:  # a waiter, not a holder
            continue
        if len(parts) > 5 and parts[5] == me and parts[4].isdigit() and int(parts[4]) != os.getpid():
            found.append(int(parts[4]))
    return sorted(set(found))


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
