"""The release ledger: composition of a dataset's releases (privacy.composition), its SQLite and GCS stores
(storage.ledger), the refusal before any data is read, races, and ``dpcda ledger``."""

from __future__ import annotations

import datetime
import json
import math
import multiprocessing
import re
import threading

import dp_accounting
import pytest
from dp_accounting import rdp

from dpcda.privacy.accounting import RDP_ORDERS, SAMPLER_DELTA_SHARE, ReleaseEvents, account
from dpcda.privacy.composition import (
    Claim,
    LedgerError,
    check_budget,
    compose,
    event_from_json,
    event_to_json,
    release_events_from_json,
    release_events_to_json,
)
from dpcda.privacy.events import DpmixEvent, GaussianStatsEvent, MixingEvent, NonPrivateEvent, PerturbEvent
from dpcda.storage.ledger import SqliteLedger, open_ledger, resolve, summary
from dpcda.storage.ledger_entries import releases_of, stored_cap
from tests.conftest import make_dataset, run_cli, write_dataset

DELTA = 1e-5


def fixed_events(sigma=0.8, sizes=(60, 80), samples=60, l=4) -> ReleaseEvents:
    stats = GaussianStatsEvent("normalization", noise_std=40.0, sensitivity=2.0)
    per_class = tuple(MixingEvent("fixed", n, samples, l, 1.0, sigma) for n in sizes)
    return ReleaseEvents("fixed", (stats,), per_class, gaussian_draws=1000)


def stated(events: ReleaseEvents) -> float:
    """What a release of ``events`` states (its manifest's epsilon): fixed mode's accounting of the same events."""
    return account(events, DELTA, cross_check=False).epsilon


def published(run, events: ReleaseEvents, eps=None, relation="fixed") -> Claim:
    eps = stated(events) if eps is None else eps
    return Claim(run, events.mode, relation, eps, DELTA, release_events_to_json(events))


def test_events_round_trip_through_json():
    evs = [
        MixingEvent("poisson", 100, 10, 4, 1.0, 0.5),
        DpmixEvent("fixed", 1000, 50, 8, 1.0, 0.3, 0.3),
        PerturbEvent(1.0, 2.0, 1.5),
        GaussianStatsEvent("class_histogram", 3.0, 1.0),
        NonPrivateEvent("normalization"),
    ]
    for ev in evs:
        assert event_from_json(json.loads(json.dumps(event_to_json(ev)))) == ev
    rel = ReleaseEvents("poisson", (evs[3],), (evs[0],), ((evs[3], 1e-7),), gaussian_draws=5, binomial_draws=2)
    assert release_events_from_json(json.loads(json.dumps(release_events_to_json(rel)))) == rel
    with pytest.raises(LedgerError, match="unknown privacy event"):
        event_from_json({"type": "Laplace"})


def _independent_rdp_epsilon(releases: list[ReleaseEvents], delta: float) -> float:
    """One RdpAccountant over every release's events, class by class: max over classes (single-class releases)."""
    worst = 0.0
    for k in range(len(releases[0].per_class)):
        acc = rdp.RdpAccountant(orders=RDP_ORDERS, neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
        for r in releases:
            acc.compose(dp_accounting.ComposedDpEvent([e.to_dp_event() for e in (*r.shared, r.per_class[k])]))
        worst = max(worst, acc.get_epsilon(delta))
    return worst


def test_fixed_releases_compose_through_their_events_like_an_independent_accountant():
    a, b = fixed_events(sigma=0.8, sizes=(70,)), fixed_events(sigma=0.6, sizes=(70,), samples=40)
    comp = compose([published("a", a), published("b", b)])  # stated as a release states them: from their events
    expected = _independent_rdp_epsilon([a, b], 2 * DELTA * (1 - SAMPLER_DELTA_SHARE))
    assert comp.epsilon == pytest.approx(expected, rel=1e-9)
    assert comp.delta == pytest.approx(2 * DELTA)
    assert comp.sum_epsilon == pytest.approx(stated(a) + stated(b))
    assert comp.epsilon < comp.sum_epsilon  # tighter than the sum here


def test_classes_need_not_match_across_releases():
    # a release's curve is the largest over its classes: never below any single class's composition
    a, b = fixed_events(sizes=(60, 200)), fixed_events(sizes=(200, 60))
    comp = compose([published("a", a), published("b", b)])
    aligned = _independent_rdp_epsilon([a, b], 2 * DELTA * (1 - SAMPLER_DELTA_SHARE))
    assert comp.epsilon >= aligned - 1e-9
    worst = fixed_events(sizes=(60,))
    assert comp.epsilon == pytest.approx(_independent_rdp_epsilon([worst, worst], 2 * DELTA * (1 - 1e-6)))


def test_one_release_composes_to_its_stated_epsilon_and_nonprivate_is_infinite():
    ev = fixed_events()
    assert compose([published("a", ev)]).epsilon == pytest.approx(stated(ev), rel=1e-12)
    leak = ReleaseEvents("fixed", (NonPrivateEvent("normalization"),), ev.per_class)
    assert math.isinf(compose([published("a", ev), published("b", leak)]).epsilon)


def test_reservations_count_at_their_target_and_poisson_sums():
    ev = fixed_events(sizes=(70,))
    alone = compose([published("a", ev)]).epsilon
    with_pending = compose([published("a", ev), Claim("b", "fixed", "fixed", 5.0, DELTA)])
    assert with_pending.epsilon == pytest.approx(alone + 5.0)
    assert "reservation" in with_pending.method
    pois = [Claim(str(i), "poisson", "poisson", 2.0, DELTA, {"mode": "poisson"}) for i in range(3)]
    assert compose(pois).epsilon == pytest.approx(6.0)
    assert compose(pois).delta == pytest.approx(3 * DELTA)


def test_relations_that_do_not_compose_are_refused_and_mixed_replace_one_is_stated_narrowly():
    fixed = published("a", fixed_events(sizes=(70,)))
    with pytest.raises(LedgerError, match="do not compose"):
        check_budget("ds", [fixed], Claim("b", "poisson", "poisson", 1.0, DELTA), cap=None)
    dpmix = Claim("c", "fixed", "dpmix/fixed", 1.0, DELTA)
    assert "within the same class" in compose([fixed, dpmix]).relation
    assert "any other record" in compose([dpmix]).relation


def test_check_budget_names_spent_and_requested():
    hist = [published("a", fixed_events(sizes=(70,)))]
    spent = compose(hist).epsilon
    ok = check_budget("ds", hist, Claim("b", "fixed", "fixed", 1.0, DELTA), cap=spent + 1.0 + 1e-9)
    assert ok["before"]["epsilon"] == pytest.approx(spent) and ok["after_at_most"]["epsilon"] <= spent + 1.0 + 1e-9
    with pytest.raises(LedgerError) as err:
        check_budget("ds", hist, Claim("b", "fixed", "fixed", 1.0, DELTA), cap=spent + 0.5)
    msg = str(err.value)
    assert f"spent epsilon {spent:.4g}" in msg and "asks 1" in msg and "before reading any data" in msg
    assert "\n" not in msg


# ---------------------------------------------------------------- the stores


def _request(run, eps=4.0, mode="fixed"):
    return {
        "run": run,
        "mechanism": "dpcda",
        "mode": mode,
        "relation": mode,
        "epsilon": eps,
        "delta": DELTA,
        "output": f"/nowhere/{run}",
    }


def _manifest(events: ReleaseEvents, eps=None) -> dict:
    eps = stated(events) if eps is None else eps
    return {
        "privacy": {"epsilon": eps, "delta": DELTA, "events": release_events_to_json(events)},
        "mechanism": {"name": "dpcda", "mode": events.mode},
        "output": {"prefix": ""},
    }


def _releases(ledger, dataset_id):
    """The dataset's release entries (without its stored cap)."""
    return [e for e in ledger.entries(dataset_id) if e["state"] != "cap"]


def _store_life_cycle(ledger):
    ledger.reserve("ds", _request("r1"), cap=10.0)
    ledger.reserve("other", _request("o1", eps=9.0), cap=10.0)  # another dataset id has its own budget
    assert [e["state"] for e in _releases(ledger, "ds")] == ["pending"]
    ledger.record("ds", "r1", _manifest(fixed_events(sizes=(70,))))
    ledger.reserve("ds", _request("r2"), cap=10.0)
    ledger.cancel("ds", "r2")  # a failed run leaves nothing
    entries = _releases(ledger, "ds")
    assert [(e["run"], e["state"]) for e in entries] == [("r1", "published")]
    assert entries[0]["events"]["per_class"][0]["class_size"] == 70
    with pytest.raises(LedgerError, match="over the budget cap"):
        ledger.reserve("ds", _request("r3", eps=7.0), cap=10.0)
    assert [e["run"] for e in _releases(ledger, "ds")] == ["r1"]
    with pytest.raises(LedgerError, match="do not compose"):
        ledger.reserve("ds", _request("p1", eps=1.0, mode="poisson"), cap=None)
    # idempotent: a reserve or record retried after a lost response changes nothing twice
    ledger.reserve("ds", _request("r4", eps=1.0), cap=10.0)
    ledger.reserve("ds", _request("r4", eps=1.0), cap=10.0)
    ledger.record("ds", "r4", _manifest(fixed_events(sizes=(70,))))
    ledger.record("ds", "r4", _manifest(fixed_events(sizes=(70,))))
    assert [(e["run"], e["state"]) for e in _releases(ledger, "ds")] == [("r1", "published"), ("r4", "published")]
    ledger.cancel("ds", "r4")  # never removes a published entry
    assert len(_releases(ledger, "ds")) == 2
    # the first release's cap was stored; ledger cap changes it; a release that gives another cap is refused
    assert summary(ledger, "other")[0]["budget_cap"] == 10.0
    ledger.set_cap("other", 9.5)
    with pytest.raises(LedgerError, match="budget cap 9.5 stored, and this release gives --budget-cap 100"):
        ledger.reserve("other", _request("o2", eps=1.0), cap=100.0)
    with pytest.raises(LedgerError, match="over the budget cap 9.5"):
        ledger.reserve("other", _request("o2", eps=1.0), cap=None)
    with pytest.raises(LedgerError, match="positive"):
        ledger.set_cap("other", -1.0)
    (other,) = summary(ledger, "other")
    assert other["budget_cap"] == 9.5 and [e["run"] for e in other["releases"]] == ["o1"]
    ledger.cancel("ds", "r4")
    ledger._transact("ds", lambda es: ([e for e in es if e["run"] != "r4"], None))
    (ds,) = summary(ledger, "ds")
    assert ds["composed"]["epsilon"] == pytest.approx(compose([published("r1", fixed_events(sizes=(70,)))]).epsilon)


def test_sqlite_life_cycle(tmp_path):
    _store_life_cycle(open_ledger(str(tmp_path / "ledger.db"), create=True))


def test_sqlite_refuses_what_is_not_a_ledger(tmp_path):
    bad = tmp_path / "x.db"
    bad.write_text("not sqlite at all, just text " * 20)
    with pytest.raises(LedgerError, match="not a ledger"):
        open_ledger(str(bad))
    with pytest.raises(LedgerError, match="does not exist"):
        open_ledger(str(tmp_path / "missing" / "ledger.db"), create=True)
    with pytest.raises(LedgerError, match="ledger init"):  # a mistyped path never starts an empty budget
        open_ledger(str(tmp_path / "typo.db"))
    from dpcda.pipeline.cli import main

    assert main(["ledger", "show", "--ledger", str(tmp_path / "typo.db")]) == 2  # one line, exit 2
    assert not (tmp_path / "typo.db").exists()


def _race_worker(path, run, barrier, results):
    ledger = SqliteLedger(path)
    barrier.wait()
    try:
        ledger.reserve("ds", _request(run, eps=6.0), cap=10.0)
        results.put((run, "ok"))
    except LedgerError:
        results.put((run, "refused"))


def test_sqlite_race_only_one_of_two_passes_a_cap_that_fits_one(tmp_path):
    path = str(tmp_path / "ledger.db")
    SqliteLedger(path, create=True)
    ctx = multiprocessing.get_context("fork")
    for attempt in range(5):  # several rounds: the outcome must never be two passes
        barrier, results = ctx.Barrier(4), ctx.Queue()
        runs = [f"a{attempt}-{i}" for i in range(4)]
        procs = [ctx.Process(target=_race_worker, args=(path, r, barrier, results)) for r in runs]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        outcomes = sorted(results.get(timeout=5)[1] for _ in runs)
        assert outcomes == ["ok", "refused", "refused", "refused"]
        passed = _releases(SqliteLedger(path), "ds")
        assert len(passed) == 1
        SqliteLedger(path).cancel("ds", passed[0]["run"])


def test_a_cap_given_on_a_first_release_is_stored_and_later_releases_answer_to_it(tmp_path, capsys):
    """A scheduler's first run passes --budget-cap 8; two eps 3 releases fit, and a third without the flag is refused
    by the stored cap (it went through, to eps 9, when only ``ledger cap`` stored a cap)."""
    from dpcda.pipeline.cli import main

    path = str(tmp_path / "ledger.db")
    ledger = open_ledger(path, create=True)
    ledger.reserve("ds", _request("r1", eps=3.0), cap=8.0)
    assert summary(ledger, "ds")[0]["budget_cap"] == 8.0
    ledger.reserve("ds", _request("r2", eps=3.0), cap=None)
    with pytest.raises(LedgerError, match="over the budget cap 8"):
        ledger.reserve("ds", _request("r3", eps=3.0), cap=None)
    # another cap on a release is refused, whether higher or lower, and the message says how to change it
    for other in (100.0, 7.0):
        with pytest.raises(
            LedgerError,
            match=re.escape(
                f"--budget-cap {other:g}; a stored cap changes only with 'dpcda "
                f"ledger cap --ledger {path} --dataset-id ds --epsilon E'"
            ),
        ):
            ledger.reserve("ds", _request("r3", eps=0.5), cap=other)
    assert [e["run"] for e in ledger.entries("ds") if e["state"] == "pending"] == ["r1", "r2"]
    ledger.reserve("ds", _request("r3", eps=0.5), cap=8.0)  # the same cap again is the stored one
    ledger.set_cap("ds", 12.0)  # changed the one way there is
    ledger.reserve("ds", _request("r4", eps=3.0), cap=None)
    ledger.reserve("ds", _request("r5", eps=0.5), cap=12.0)
    # a first release refused for the budget stores the cap it gives, and no reservation
    with pytest.raises(LedgerError, match="over the budget cap 2"):
        ledger.reserve("fresh", _request("f1", eps=3.0), cap=2.0)
    assert stored_cap(ledger.entries("fresh")) == 2.0 and releases_of(ledger.entries("fresh")) == []
    # and a release refused without a cap to store writes nothing
    with pytest.raises(LedgerError, match="over the budget cap 2"):
        ledger.reserve("fresh", _request("f2", eps=3.0), cap=None)
    assert len(ledger.entries("fresh")) == 1

    assert main(["ledger", "show", "--ledger", path, "--dataset-id", "ds"]) == 0
    assert "dataset ds: 5 release(s), budget cap 12" in capsys.readouterr().out
    assert main(["ledger", "show", "--ledger", path, "--dataset-id", "ds", "--json"]) == 0
    (shown,) = json.loads(capsys.readouterr().out)
    assert shown["budget_cap"] == 12.0 and len(shown["releases"]) == 5


def test_a_cap_given_on_a_release_refused_for_the_budget_still_holds_for_the_next_runs(tmp_path):
    """Two eps 3 releases without a cap, then one with --budget-cap 8 that would reach 9: refused; the next run
    without the flag answers to the cap that was given (it went through to eps 9 when the refusal stored nothing)."""
    ledger = open_ledger(str(tmp_path / "ledger.db"), create=True)
    ledger.reserve("ds", _request("r1", eps=3.0), cap=None)
    ledger.reserve("ds", _request("r2", eps=3.0), cap=None)
    with pytest.raises(LedgerError, match="over the budget cap 8"):
        ledger.reserve("ds", _request("r3", eps=3.0), cap=8.0)
    with pytest.raises(LedgerError, match="over the budget cap 8"):
        ledger.reserve("ds", _request("r3", eps=3.0), cap=None)
    assert [e["run"] for e in releases_of(ledger.entries("ds"))] == ["r1", "r2"]
    ledger.reserve("ds", _request("r3", eps=1.0), cap=None)  # what fits under the cap still goes through


def test_a_dataset_id_with_a_trailing_newline_is_refused(tmp_path):
    ledger = open_ledger(str(tmp_path / "ledger.db"), create=True)
    with pytest.raises(LedgerError, match="dataset_id"):
        ledger.set_cap("ds\n", 1.0)
    with pytest.raises(LedgerError, match="dataset_id"):
        ledger.reserve("ds\n", _request("r1", eps=1.0), cap=None)


def _cap_race_worker(path, dataset_id, run, cap, barrier, results):
    ledger = SqliteLedger(path)
    barrier.wait()
    try:
        ledger.reserve(dataset_id, _request(run, eps=1.0), cap=cap)
        results.put((cap, "ok"))
    except LedgerError as err:
        results.put((cap, str(err)))


def test_two_first_releases_with_different_caps_store_exactly_one(tmp_path):
    """The cap is stored in the transaction that writes the reservation: of first releases racing with different
    caps, one cap is stored, and every release that gave another is refused in one line naming ``ledger cap``."""
    path = str(tmp_path / "ledger.db")
    SqliteLedger(path, create=True)
    ctx = multiprocessing.get_context("fork")
    for attempt in range(3):
        ds, caps = f"ds{attempt}", [5.0, 6.0, 7.0, 8.0]
        barrier, results = ctx.Barrier(len(caps)), ctx.Queue()
        procs = [
            ctx.Process(target=_cap_race_worker, args=(path, ds, f"r{cap:g}", cap, barrier, results)) for cap in caps
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        outcomes = dict(results.get(timeout=5) for _ in caps)
        winners = [cap for cap, said in outcomes.items() if said == "ok"]
        assert len(winners) == 1, outcomes
        for cap, said in outcomes.items():
            if cap != winners[0]:
                assert f"has budget cap {winners[0]:g} stored" in said and "dpcda ledger cap" in said, said
        (shown,) = summary(SqliteLedger(path), ds)
        assert shown["budget_cap"] == winners[0] and [e["run"] for e in shown["releases"]] == [f"r{winners[0]:g}"]


def _hold_lock(path, seconds):
    """Another process that takes an exclusive lock on the SQLite ledger and keeps it ``seconds``."""
    import subprocess
    import sys

    code = (
        "import sqlite3, sys, time; c = sqlite3.connect(sys.argv[1], isolation_level=None); "
        "c.execute('BEGIN EXCLUSIVE'); print('locked', flush=True); time.sleep(float(sys.argv[2]))"
    )
    holder = subprocess.Popen([sys.executable, "-c", code, path, str(seconds)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    return holder


def test_a_locked_ledger_is_busy_not_invalid_and_the_wait_is_bounded_and_said(tmp_path, monkeypatch, capsys, caplog):
    """Bad-input case M8: a ledger another process holds locked was called 'not a ledger SQLite file (database is
    locked)' after 120 silent seconds; a user told that may recreate it and lose the budget history."""
    from dpcda.pipeline.cli import main
    from dpcda.storage import ledger as ledger_mod

    path = str(tmp_path / "ledger.db")
    open_ledger(path, create=True).reserve("ds", _request("r1", eps=1.0), cap=None)
    monkeypatch.setattr(ledger_mod, "LOCK_WAIT_SECONDS", 2)
    holder = _hold_lock(path, 30)
    try:
        with caplog.at_level("WARNING", logger="dpcda.ledger"):
            assert main(["ledger", "show", "--ledger", path]) == 2
        (line,) = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
        assert line.startswith(f"dpcda: error: ledger {path}: busy: another process ({holder.pid}) holds its lock")
        assert "within 2 s" in line and "not a ledger" not in line and "not damaged" in line
        assert f"ledger {path} is busy (its lock is held by process {holder.pid}); waiting up to 2 s" in caplog.text
        with pytest.raises(LedgerError, match="busy"):
            SqliteLedger(path).reserve("ds", _request("r2", eps=1.0), cap=None)
    finally:
        holder.kill()
        holder.wait()
    # a holder that lets go within the wait: the release goes on
    monkeypatch.setattr(ledger_mod, "LOCK_WAIT_SECONDS", 30)
    holder = _hold_lock(path, 1.5)
    try:
        SqliteLedger(path).reserve("ds", _request("r2", eps=1.0), cap=None)
    finally:
        holder.wait()
    assert [e["run"] for e in _releases(SqliteLedger(path), "ds")] == ["r1", "r2"]


@pytest.mark.gcs
def test_gcs_life_cycle_and_race(gcs):
    with pytest.raises(LedgerError, match="ledger init"):
        open_ledger(f"{gcs}/ledgers/privacy.json")
    _store_life_cycle(open_ledger(f"{gcs}/ledgers/privacy.json", create=True))
    uri = f"{gcs}/ledgers/race.json"
    open_ledger(uri, create=True)
    outcomes, barrier = [], threading.Barrier(4)

    def worker(run):
        ledger = open_ledger(uri)
        barrier.wait()
        try:
            ledger.reserve("ds", _request(run, eps=6.0), cap=10.0)
            outcomes.append("ok")
        except LedgerError:
            outcomes.append("refused")

    threads = [threading.Thread(target=worker, args=(f"t{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(outcomes) == ["ok", "refused", "refused", "refused"]
    assert len(_releases(open_ledger(uri), "ds")) == 1


def test_resolve_records_a_published_run_and_drops_a_dead_one(tmp_path):
    ledger = open_ledger(str(tmp_path / "ledger.db"), create=True)
    out = tmp_path / "rel"
    out.mkdir()
    ledger.reserve("ds", {**_request("live"), "output": str(out)}, cap=None)
    with pytest.raises(LedgerError, match="may still be running"):
        resolve(ledger, "ds", "live")
    manifest = {**_manifest(fixed_events(sizes=(70,))), "ledger": {"run": "live"}}
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert resolve(ledger, "ds", "live", force=True) == "recorded"
    ledger.reserve("ds", _request("dead"), cap=None)

    def age(entries):  # as if reserved two days ago
        for e in entries:
            if e["run"] == "dead":
                e["reserved_at"] = (
                    datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=2)
                ).isoformat()
        return entries, None

    ledger._transact("ds", age)
    assert resolve(ledger, "ds", "dead") == "dropped"
    assert [(e["run"], e["state"]) for e in ledger.entries("ds")] == [("live", "published")]
    with pytest.raises(LedgerError, match="already recorded"):
        resolve(ledger, "ds", "live")


# ---------------------------------------------------------------- through the release job


@pytest.mark.slow  # three releases through the job (about 26 s); the refusal logic is covered in-process above
def test_three_releases_against_a_cap_that_fits_two(tmp_path, capsys):
    x, y = make_dataset(n_per_class=60, num_classes=3, dim=16)
    good = write_dataset(tmp_path / "in", x, y)
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "part-0.parquet").write_bytes(b"PAR1 this is not a parquet file PAR1")  # reading it would fail
    ledger = str(tmp_path / "ledger.db")
    common = ["--epsilon", 4, "--ledger", ledger, "--dataset-id", "toy"]
    assert run_cli("ledger", "init", "--ledger", ledger).returncode == 0
    # cap 9: the first two fit (3.99, then 3.99 + 4 <= 9); the two compose to about 5.57, and the third is checked at
    # 5.57 + 4 > 9 before its data is read (docs/privacy.md: the check counts a new release at its full target)
    assert run_cli("ledger", "cap", "--ledger", ledger, "--dataset-id", "toy", "--epsilon", 9).returncode == 0
    for i in (1, 2):
        res = run_cli("release", "--input", good, "--output", tmp_path / f"rel{i}", *common)
        assert res.returncode == 0, res.stderr
    third = run_cli("release", "--input", str(corrupt / "*.parquet"), "--output", tmp_path / "rel3", *common)
    assert third.returncode == 2
    err = third.stderr.strip().splitlines()[-1]
    assert err.startswith("dpcda: error: ledger: dataset 'toy' has spent epsilon") and "asks 4" in err, third.stderr
    assert not (tmp_path / "rel3").exists()

    shown = run_cli("ledger", "show", "--ledger", ledger, "--dataset-id", "toy", "--json")
    assert shown.returncode == 0, shown.stderr
    (ds,) = json.loads(shown.stdout)
    assert [e["state"] for e in ds["releases"]] == ["published", "published"]
    manifests = [json.loads((tmp_path / f"rel{i}" / "manifest.json").read_text()) for i in (1, 2)]
    assert [m["ledger"]["run"] for m in manifests] == [e["run"] for e in ds["releases"]]
    assert manifests[1]["ledger"]["before"]["releases"] == 1
    events = [release_events_from_json(m["privacy"]["events"]) for m in manifests]
    expected = _independent_rdp_epsilon(events, 2 * DELTA * (1 - SAMPLER_DELTA_SHARE))
    assert ds["composed"]["epsilon"] == pytest.approx(expected, rel=1e-9)
    assert ds["composed"]["epsilon"] < sum(m["privacy"]["epsilon"] for m in manifests)
    from dpcda.pipeline.cli import main

    assert main(["ledger", "show", "--ledger", ledger]) == 0  # the text form, in-process
    out = capsys.readouterr().out
    assert "dataset toy: 2 release(s), budget cap 9" in out and "composed: eps" in out


def test_a_release_that_fails_leaves_no_entry(tmp_path):
    x, y = make_dataset(n_per_class=3, num_classes=2, dim=8)  # 3 records per class < l = 4: refused by the plan
    inp = write_dataset(tmp_path / "in", x, y)
    ledger = str(tmp_path / "ledger.db")
    open_ledger(ledger, create=True)
    res = run_cli(
        "release",
        "--input",
        inp,
        "--output",
        tmp_path / "rel",
        "--epsilon",
        2,
        "--ledger",
        ledger,
        "--dataset-id",
        "toy",
    )
    assert res.returncode == 2 and "fewer than mixing_order" in res.stderr
    assert open_ledger(ledger).entries() == []
    (tmp_path / "out").mkdir()
    inside = str(tmp_path / "out" / "ledger.db")
    open_ledger(inside, create=True)
    res = run_cli(
        "release",
        "--input",
        inp,
        "--output",
        tmp_path / "out",
        "--epsilon",
        2,
        "--ledger",
        inside,
        "--dataset-id",
        "toy",
    )
    assert res.returncode == 2 and "lies inside the output" in res.stderr, res.stderr
    assert open_ledger(inside).entries() == []


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"ledger": "L.db"}, "dataset_id: required with --ledger"),
        ({"dataset_id": "x"}, "dataset_id: only used with --ledger"),
        ({"budget_cap": 3}, "budget_cap: only used with --ledger"),
        ({"ledger": "L.db", "dataset_id": "x", "seed": 1}, "TEST seed"),
        ({"ledger": "L.db", "dataset_id": " x"}, "dataset_id"),
        (
            {"ledger": "L.db", "dataset_id": "x", "normalization": "exact", "allow_exact_normalization": True},
            "not end-to-end DP",
        ),
        ({"ledger": "L.db", "dataset_id": "x", "epsilon": None, "sigma_x": 1.0}, "give --epsilon"),
    ],
)
def test_ledger_fields_are_checked_before_work(fields, message):
    from dpcda.schemas.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(None, {"input": "in/*.parquet", "output": "out", "epsilon": 1.0, **fields})


def test_a_ledger_field_error_is_one_line_on_the_command_line(tmp_path):
    res = run_cli(
        "release",
        "--input",
        tmp_path / "none.parquet",
        "--output",
        tmp_path / "o",
        "--epsilon",
        1,
        "--ledger",
        tmp_path / "L.db",
    )
    assert res.returncode == 2 and res.stderr.strip().splitlines()[-1].startswith("dpcda: error: dataset_id")


# ---------------------------------------------------------------- failures around the publish


def _small_release_config(tmp_path, ledger):
    from dpcda.schemas.config import load_config

    x, y = make_dataset(n_per_class=30, num_classes=2, dim=8)
    inp = write_dataset(tmp_path / "in", x, y)
    return load_config(
        None,
        {"input": inp, "output": str(tmp_path / "rel"), "epsilon": 3.0, "ledger": ledger, "dataset_id": "toy"},
    )


def test_an_interrupt_after_the_publish_still_records_the_release(tmp_path, monkeypatch):
    from dpcda.pipeline.release import run_release
    from dpcda.storage import publish
    from tests.conftest import BEAM_ARGS

    ledger = str(tmp_path / "ledger.db")
    open_ledger(ledger, create=True)
    real = publish.publish

    def publish_then_interrupt(target, manifest):
        real(target, manifest)
        raise KeyboardInterrupt()  # e.g. SIGINT while the old release is removed

    monkeypatch.setattr(publish, "publish", publish_then_interrupt)
    with pytest.raises(KeyboardInterrupt) as err:
        run_release(_small_release_config(tmp_path, ledger), BEAM_ARGS)
    assert getattr(err.value, "published", False)
    (entry,) = open_ledger(ledger).entries("toy")
    assert entry["state"] == "published" and entry["events"]["mode"] == "fixed"
    manifest = json.loads((tmp_path / "rel" / "manifest.json").read_text())
    assert manifest["ledger"]["run"] == entry["run"]


def test_a_ledger_that_cannot_record_leaves_the_reservation_and_says_the_release_is_out(tmp_path, monkeypatch):
    from dpcda.pipeline.release import ReleaseError, run_release
    from dpcda.storage import ledger as ledger_mod
    from tests.conftest import BEAM_ARGS

    ledger = str(tmp_path / "ledger.db")
    open_ledger(ledger, create=True)

    def broken(self, *a, **k):
        raise LedgerError("ledger: unreachable")

    monkeypatch.setattr(ledger_mod.Ledger, "record", broken)
    with pytest.raises(ReleaseError, match="WAS published") as err:
        run_release(_small_release_config(tmp_path, ledger), BEAM_ARGS)
    assert err.value.published
    assert [e["state"] for e in open_ledger(ledger).entries("toy")] == ["pending"]  # counted at the target


def test_resolve_never_drops_on_ambiguity_and_waits_for_a_live_run(tmp_path):
    import fcntl
    import os

    from dpcda.storage.locks import lock_path
    from dpcda.storage.publish import check_output_path

    ledger = open_ledger(str(tmp_path / "ledger.db"), create=True)
    out = tmp_path / "rel"
    out.mkdir()
    ledger.reserve("ds", {**_request("old"), "output": check_output_path(str(out))}, cap=None)
    later = {**_manifest(fixed_events(sizes=(70,))), "ledger": {"run": "someone-else"}}
    later["created_at"] = (datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1)).isoformat()
    (out / "manifest.json").write_text(json.dumps(later))
    with pytest.raises(LedgerError, match="--drop"):  # published and then replaced? it cannot tell: it refuses
        resolve(ledger, "ds", "old", force=True)
    fd = os.open(lock_path(str(out)), os.O_CREAT | os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        with pytest.raises(LedgerError, match="holds its lock"):
            resolve(ledger, "ds", "old", force=True, drop=True)
    finally:
        os.close(fd)
    assert resolve(ledger, "ds", "old", force=True, drop=True) == "dropped"
    later["created_at"] = "2000-01-01T00:00:00+00:00"  # a release older than the reservation: nothing of ours
    (out / "manifest.json").write_text(json.dumps(later))
    ledger.reserve("ds", {**_request("new"), "output": check_output_path(str(out))}, cap=None)
    assert resolve(ledger, "ds", "new", force=True) == "dropped"


def test_malformed_events_end_in_a_ledger_error():
    bad = Claim("x", "fixed", "fixed", 1.0, DELTA, {"mode": "fixed", "per_class": [{"type": "MixingEvent"}]})
    with pytest.raises(LedgerError, match="malformed"):
        compose([bad])


def _put_rows(path: str, rows: list[dict]) -> None:
    """Rows written straight into the SQLite file (as a hand edit or a corrupted copy would)."""
    import sqlite3

    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.executemany(
            "INSERT INTO releases (dataset_id, run, entry) VALUES (?, ?, ?)",
            [(r["dataset_id"], r["run"], json.dumps(r)) for r in rows],
        )
    finally:
        conn.close()


def test_rows_that_would_count_as_no_spend_are_refused(tmp_path):
    from dpcda.storage.ledger import entry_problem

    ev = fixed_events(sizes=(70,))
    good = {
        "run": "r",
        "dataset_id": "ds",
        "state": "published",
        "mode": "fixed",
        "relation": "fixed",
        "epsilon": stated(ev),
        "delta": DELTA,
        "events": release_events_to_json(ev),
    }
    assert entry_problem(good) is None
    assert entry_problem({**good, "state": "pending", "epsilon": None, "events": None}) is None  # counted as inf
    truncated = {"mode": "fixed", "shared": release_events_to_json(ev)["shared"]}
    bad = [
        {"epsilon": float("nan")},
        {"epsilon": float("-inf")},
        {"epsilon": float("inf")},
        {"epsilon": -1e9, "state": "pending"},
        {"epsilon": 0.0},
        {"delta": float("nan")},
        {"delta": -1e-5},
        {"delta": 1.0},
        {"mode": "laplace"},
        {"relation": "nobody"},
        {"relation": "poisson"},
        {"state": "cap"},
        {"run": "(cap)"},
        {"events": {"mode": "fixed"}},
        {"events": {"mode": "poisson", "per_class": release_events_to_json(ev)["per_class"]}},
        {"events": None},
        {"events": {"mode": "fixed", "per_class": [{"type": "MixingEvent"}]}},
    ]
    for change in bad:
        assert entry_problem({**good, **change}) is not None, change
    # composition itself refuses what a store might not check, in one line instead of a KeyError
    for claim in (
        Claim("x", "laplace", "fixed", 1.0, DELTA),
        Claim("x", "fixed", "nobody", 1.0, DELTA),
        Claim("x", "fixed", "fixed", -1e9, DELTA),
        Claim("x", "fixed", "fixed", float("nan"), DELTA),
        Claim("x", "fixed", "fixed", 1.0, float("nan")),
    ):
        with pytest.raises(LedgerError, match="run x"):
            compose([claim])
    # events that compose to less than a release states alone (truncated, edited) are refused
    with pytest.raises(LedgerError, match="run a: .*compose to less"):
        compose([Claim("a", "fixed", "fixed", stated(ev), DELTA, truncated), published("b", ev)])

    # through a store: two published rows of epsilon 4 with their events cut to the mode, and a pending row of
    # epsilon -1e9, no longer let a release of epsilon 100 pass a cap of 5; the refusal names the ledger and the row
    path = str(tmp_path / "l.db")
    ledger = open_ledger(path, create=True)
    _put_rows(path, [{**good, "run": r, "epsilon": 4.0, "events": {"mode": "fixed"}} for r in ("p1", "p2")])
    with pytest.raises(LedgerError) as err:
        ledger.reserve("ds", _request("new", eps=1.0), cap=100.0)
    assert path in str(err.value) and "p1" in str(err.value) and "\n" not in str(err.value)
    other = str(tmp_path / "m.db")
    ledger = open_ledger(other, create=True)
    _put_rows(other, [{**good, "run": "neg", "state": "pending", "epsilon": -1e9, "events": None}])
    with pytest.raises(LedgerError, match="neg"):
        ledger.reserve("ds", _request("big", eps=100.0), cap=5.0)
    # and a store never writes such a row: a manifest without events is not recorded, its reservation stays
    third = open_ledger(str(tmp_path / "n.db"), create=True)
    third.reserve("ds", _request("r"), cap=None)
    manifest = _manifest(ev)
    with pytest.raises(LedgerError, match="cannot be recorded"):
        third.record("ds", "r", {**manifest, "privacy": {**manifest["privacy"], "events": None}})
    assert [e["state"] for e in third.entries("ds")] == ["pending"]


def test_resolve_turns_a_storage_error_into_one_line(tmp_path, capsys):
    from unittest import mock

    from google.api_core import exceptions as gexc

    from dpcda.pipeline.cli import main

    path = str(tmp_path / "l.db")
    ledger = open_ledger(path, create=True)
    ledger.reserve("ds", {**_request("r"), "output": "gs://lake/rel"}, cap=None)
    with mock.patch("dpcda.storage.paths.open_file", side_effect=gexc.Forbidden("403 caller lacks access")):
        code = main(["ledger", "resolve", "--ledger", path, "--dataset-id", "ds", "--run", "r", "--force"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "Forbidden" in err and "nothing changed" in err, err
    assert [e["state"] for e in ledger.entries("ds")] == ["pending"]
    help_text = " ".join(main_help(["ledger", "resolve", "--help"], capsys).split())
    assert "exposed" in help_text and "gs://" in help_text


def main_help(argv, capsys) -> str:
    from dpcda.pipeline.cli import main

    with pytest.raises(SystemExit):
        main(argv)
    return capsys.readouterr().out


def test_honest_releases_of_unequal_budgets_compose_and_edited_events_of_any_one_are_refused(tmp_path):
    """At the summed delta a large release plus a small one can compose to less than the large one states at its own
    delta: that is no sign of editing, and the composed figure never falls below any single release. Events edited
    on any release (not only the largest) are refused."""
    from dpcda.privacy.accounting import ReleaseEvents
    from dpcda.privacy.composition import Claim, ClaimError, compose, release_events_to_json
    from dpcda.privacy.events import MixingEvent

    big, small = fixed_events(sigma=0.6, sizes=(70,)), fixed_events(sigma=5.0, sizes=(70,))
    both = compose([published("r1", big), published("r2", small)])
    assert both.epsilon >= stated(big) and both.epsilon <= stated(big) + stated(small)
    a, c, b = (fixed_events(sigma=s, sizes=(70,)) for s in (0.6, 0.6, 0.65))
    edited = ReleaseEvents("fixed", b.shared, (MixingEvent("fixed", 70, 1, 4, 1.0, 0.65),), gaussian_draws=1000)
    forged = Claim("b", "fixed", "fixed", stated(b), DELTA, release_events_to_json(edited))
    with pytest.raises(ClaimError, match="run 'b'|b"):
        compose([published("a", a), published("c", c), forged])
