"""The release ledger: every release of a dataset id, kept in a local SQLite file or one gs:// object.

A release reserves its budget before it reads any data (``reserve``: the history and the new release's target are
composed by ``privacy.composition`` and checked against the cap in the same transaction that writes the
reservation), and is recorded with its stated guarantee and DP events once published (``record``). A release that
fails or is interrupted before publishing removes its reservation (``cancel``); one that died without a word leaves
it, and it keeps counting at its target epsilon (never less than it spent) until ``dpcda ledger resolve`` records or
drops it.

Races. Two releases racing on one ledger cannot both pass a cap that only one fits: SQLite takes its write lock
(``BEGIN IMMEDIATE``) before reading the history; on GCS the ledger object is rewritten with ``if_generation_match``
set to the generation that was read, and a writer that lost the race reads again and decides again.
"""

from __future__ import annotations

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

from privacy.accounting import relation_key
from privacy.composition import Claim, LedgerError, check_budget, compose
from storage.paths import is_remote

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


class Ledger:
    """Reserve, record, cancel and list releases; subclasses supply one atomic read-modify-write."""

    uri: str

    def _transact(self, dataset_id: str, fn: Transaction):
        raise NotImplementedError

    def entries(self, dataset_id: Optional[str] = None) -> list[dict]:
        raise NotImplementedError

    def reserve(self, dataset_id: str, request: dict, cap: Optional[float]) -> dict:
        """Composes the history with ``request`` (run, mechanism, mode, relation, epsilon, delta, output) and writes
        a reservation if the result fits ``cap``; returns the manifest's ``ledger`` section. Raises LedgerError."""

        def fn(entries):
            figures = check_budget(dataset_id, [claim_of(e) for e in entries], claim_of(entry), cap)
            return [*entries, entry], figures

        entry = {**request, "dataset_id": dataset_id, "state": "pending", "reserved_at": _now(), "events": None}
        figures = self._transact(dataset_id, fn)
        log.info(
            "stage=ledger dataset=%s run=%s reserved epsilon=%s (before %.4g, after at most %.4g, cap %s)",
            dataset_id,
            request["run"],
            request["epsilon"],
            figures["before"]["epsilon"],
            figures["after_at_most"]["epsilon"],
            cap,
        )
        return {"uri": self.uri, "dataset_id": dataset_id, "run": request["run"], **figures}

    def record(self, dataset_id: str, run: str, manifest: dict) -> None:
        """The published release's stated guarantee and events replace its reservation."""
        p = manifest["privacy"]

        published = {
            "state": "published",
            "epsilon": p["epsilon"],
            "delta": p["delta"],
            "events": p.get("events"),
            "published_at": _now(),
            "prefix": manifest.get("output", {}).get("prefix", ""),
        }

        def fn(entries):
            for e in entries:
                if e["run"] == run and e["state"] == "pending":
                    e.update(published)
                    return entries, None
            # its reservation was dropped (``resolve --force`` while it ran): what was published is recorded anyway
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
            return [*entries, entry], None

        self._transact(dataset_id, fn)
        log.info("stage=ledger dataset=%s run=%s recorded epsilon=%s", dataset_id, run, p["epsilon"])

    def cancel(self, dataset_id: str, run: str) -> None:
        """Removes a reservation (never a published entry)."""

        def fn(entries):
            return [e for e in entries if not (e["run"] == run and e["state"] == "pending")], None

        self._transact(dataset_id, fn)


class SqliteLedger(Ledger):
    """One row per release; a transaction takes the write lock before it reads."""

    def __init__(self, path: str):
        self.uri = path
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            raise LedgerError(f"ledger {path}: folder {parent} does not exist")
        if os.path.exists(path) and not os.path.isfile(path):
            raise LedgerError(f"ledger {path}: not a regular file")
        try:
            with contextlib.closing(self._connect()) as conn:
                conn.execute(
                    "CREATE TABLE IF NOT EXISTS releases (seq INTEGER PRIMARY KEY AUTOINCREMENT, dataset_id TEXT NOT "
                    "NULL, run TEXT NOT NULL, entry TEXT NOT NULL, UNIQUE (dataset_id, run))"
                )
                cols = [r[1] for r in conn.execute("PRAGMA table_info(releases)")]
        except sqlite3.DatabaseError as err:
            raise LedgerError(f"ledger {path}: not a ledger SQLite file ({err})") from None
        if cols != ["seq", "dataset_id", "run", "entry"]:
            raise LedgerError(f"ledger {path}: its 'releases' table is not a ledger's (columns {cols})")

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.uri, timeout=120, isolation_level=None)

    def _transact(self, dataset_id: str, fn: Transaction):
        conn = self._connect()
        try:
            conn.execute("BEGIN IMMEDIATE")  # the write lock first: no other writer reads the history meanwhile
            rows = conn.execute("SELECT entry FROM releases WHERE dataset_id = ? ORDER BY seq", (dataset_id,))
            entries = [json.loads(r[0]) for r in rows]
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
        with contextlib.closing(self._connect()) as conn:
            if dataset_id is None:
                rows = conn.execute("SELECT entry FROM releases ORDER BY seq")
            else:
                rows = conn.execute("SELECT entry FROM releases WHERE dataset_id = ? ORDER BY seq", (dataset_id,))
            return [json.loads(r[0]) for r in rows]


class GcsLedger(Ledger):
    """One JSON object; every change rewrites it with a generation precondition and retries when it lost a race."""

    def __init__(self, uri: str):
        from storage.publish import gcs_client, split_gs

        self.uri = uri
        bucket, self.name = split_gs(uri)
        if not self.name:
            raise LedgerError(f"ledger {uri}: name an object, e.g. gs://bucket/ledgers/privacy.json")
        self.bucket = gcs_client().bucket(bucket)

    def _read(self) -> tuple[list[dict], int]:
        blob = self.bucket.get_blob(self.name)
        if blob is None:
            return [], 0
        generation = int(blob.generation)  # before the download, which may refresh the blob's properties
        try:  # content newer than ``generation`` cannot be written back: the upload's precondition fails
            data = json.loads(blob.download_as_bytes())
        except ValueError:
            raise LedgerError(f"ledger {self.uri}: not valid JSON") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise LedgerError(f"ledger {self.uri}: not a ledger object (format {FORMAT} expected)")
        return list(data.get("entries", [])), generation

    def _transact(self, dataset_id: str, fn: Transaction):
        from google.api_core import exceptions as gexc

        for attempt in range(GCS_ATTEMPTS):
            everything, generation = self._read()
            mine = [e for e in everything if e["dataset_id"] == dataset_id]
            new, result = fn([dict(e) for e in mine])
            others = [e for e in everything if e["dataset_id"] != dataset_id]
            text = json.dumps({"format": FORMAT, "entries": [*others, *new]}, indent=1, allow_nan=False)
            try:
                self.bucket.blob(self.name).upload_from_string(
                    text, content_type="application/json", if_generation_match=generation
                )
                return result
            except gexc.PreconditionFailed:  # another writer got there first: read its history and decide again
                time.sleep(random.uniform(0.05, 0.2) * (1 + attempt))  # back-off jitter (no private data involved)
        raise LedgerError(f"ledger {self.uri}: still contended after {GCS_ATTEMPTS} attempts; try again")

    def entries(self, dataset_id: Optional[str] = None) -> list[dict]:
        everything, _ = self._read()
        return [e for e in everything if dataset_id is None or e["dataset_id"] == dataset_id]


def open_ledger(uri: str) -> Ledger:
    if is_remote(uri):
        if not uri.startswith("gs://"):
            raise LedgerError(f"ledger {uri}: a local SQLite file or gs://bucket/object")
        return GcsLedger(uri)
    return SqliteLedger(uri)


def summary(ledger: Ledger, dataset_id: Optional[str] = None) -> list[dict]:
    """Per dataset id: its entries and what they guarantee together (``dpcda ledger show``)."""
    entries = ledger.entries(dataset_id)
    out = []
    for ds in dict.fromkeys(e["dataset_id"] for e in entries):
        mine = [e for e in entries if e["dataset_id"] == ds]
        try:
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
        out.append({"dataset_id": ds, "releases": mine, "composed": total})
    return out


RESOLVE_AFTER_HOURS = 24.0


def resolve(ledger: Ledger, dataset_id: str, run: str, *, force: bool = False) -> str:
    """A reservation left by a run that died: recorded if the run's release is at its OUTPUT (the manifest names the
    run), dropped otherwise. Refuses a reservation younger than RESOLVE_AFTER_HOURS unless ``force``: its run may
    still be going. Returns 'recorded' or 'dropped'."""
    from storage.paths import join, open_file

    found = [e for e in ledger.entries(dataset_id) if e["run"] == run]
    if not found:
        raise LedgerError(f"ledger {ledger.uri}: dataset '{dataset_id}' has no run {run}")
    entry = found[0]
    if entry["state"] != "pending":
        raise LedgerError(f"ledger {ledger.uri}: run {run} is already recorded as published")
    age = (
        datetime.datetime.now(datetime.timezone.utc) - datetime.datetime.fromisoformat(entry["reserved_at"])
    ).total_seconds() / 3600
    if age < RESOLVE_AFTER_HOURS and not force:
        raise LedgerError(
            f"ledger: run {run} reserved {age:.1f} h ago and may still be running; pass --force if it is known to "
            f"have stopped"
        )
    manifest = None
    try:
        with open_file(join(entry["output"], "manifest.json")) as fh:
            manifest = json.loads(fh.read())
    except (OSError, ValueError, TypeError):
        manifest = None
    if manifest is not None and (manifest.get("ledger") or {}).get("run") == run:
        ledger.record(dataset_id, run, manifest)
        return "recorded"
    ledger.cancel(dataset_id, run)
    return "dropped"
