"""The shared batches' work queue (store/claims.py) on a folder store and on a real PostgreSQL server."""

from __future__ import annotations

import functools
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest

from store import claim_table
from store.backend import Database
from store.backends.sqlite.catalog import stamp
from store.claims import WorkQueue, claims_summary, sweep
from store.descriptor import ModelDescriptor
from store.settings import Settings
from store.store import Store
from tests.factories import completion_record, settled

RECORDS = [completion_record(i) for i in range(10)]
KEYS = [r.input_hash for r in RECORDS]


@pytest.fixture(params=["folder", "postgres"])
def database(request: pytest.FixtureRequest, tmp_path: Path, descriptor: ModelDescriptor) -> Iterator[Database]:
    if request.param == "folder":
        store = Store(Settings(), root=tmp_path / "store")
    else:
        store = Store(Settings(), url=request.getfixturevalue("pg_url"))
    with store:
        yield store.database("completions", "t", descriptor)


def test_two_jobs_never_hold_the_same_input_and_claim_in_the_batch_order(database: Database) -> None:
    a, b = WorkQueue(database, holder="a"), WorkQueue(database, holder="b")
    a.join(KEYS)
    b.join(KEYS)  # a second join changes nothing
    first = a.claim(KEYS, 4)
    second = b.claim(KEYS, 4)
    assert first == KEYS[:4] and second == KEYS[4:8]
    assert a.claim(KEYS, 100) == KEYS[8:]
    assert b.claim(KEYS, 100) == []
    state = b.state(KEYS)
    assert (state.leased, state.waiting, len(state.stored), state.holders) == (10, 0, 0, frozenset({"a", "b"}))


def test_a_claim_over_many_key_batches_leases_no_more_than_its_limit(
    database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(claim_table, "KEY_BATCH", 3)  # the ten keys in four lists, as 20,000 a list would be
    queue = WorkQueue(database, holder="a")
    queue.join(KEYS)
    assert queue.claim(KEYS, 4) == KEYS[:4]  # the second list fills the limit: one of its three, not three
    assert queue.claim(KEYS, 100) == KEYS[4:]
    assert queue.state(KEYS).leased == 10


def test_stored_inputs_are_never_claimed_and_finishing_deletes_their_claims(database: Database) -> None:
    queue = WorkQueue(database, holder="a")
    queue.join(KEYS)
    block = queue.claim(KEYS, 3)
    database.put_many(RECORDS[:3])
    queue.finish(block)
    database.put_many(RECORDS[3:5])  # stored by someone else meanwhile: left behind claims are harmless
    assert queue.claim(KEYS, 3) == KEYS[5:8]
    state = queue.state(KEYS)
    assert (state.stored, state.leased, state.waiting) == (frozenset(KEYS[:5]), 3, 2)
    summary = claims_summary(database)
    assert (summary.leased, summary.waiting, summary.done, summary.jobs) == (3, 2, 2, 1)


def sleep_until(moment: float) -> None:
    """Sleep until ``time.monotonic()`` reaches ``moment``: a slow statement before it shortens the sleep."""
    time.sleep(max(0.0, moment - time.monotonic()))


# Leases here last about a second: a statement on a loaded machine (the whole suite on two cores, a server in a
# process of its own) can take a few hundred milliseconds, and a lease must outlive the statements it spans.
def test_a_lease_past_its_deadline_is_taken_over_and_renewing_keeps_it(database: Database) -> None:
    dead = WorkQueue(database, holder="dead", lease_seconds=1.0)
    alive = WorkQueue(database, holder="alive", lease_seconds=2.0)
    other = WorkQueue(database, holder="other", lease_seconds=5)
    dead.join(KEYS)
    assert dead.claim(KEYS, 2) == KEYS[:2]
    assert alive.claim(KEYS, 2) == KEYS[2:4]
    claimed = time.monotonic()  # both deadlines are at most a lease after this
    sleep_until(claimed + 1.0)
    assert alive.renew() == 2
    sleep_until(claimed + 2.1)  # dead's deadline passed, and alive's first one; alive's renewed one (+3.0) has not
    state = other.state(KEYS)
    assert (state.stale, state.leased) == (2, 2)
    assert claims_summary(database).stale == 2
    assert other.claim(KEYS, 3) == [*KEYS[:2], KEYS[4]]  # the stale leases first, in order
    assert dead.renew() == 0  # taken over: the dead job renews nothing


def test_leases_given_back_are_claimable_at_once_and_nothing_else_is_touched(database: Database) -> None:
    stopping, other = WorkQueue(database, holder="stopping", lease_seconds=600), WorkQueue(database, holder="other")
    stopping.join(KEYS[:6])
    assert stopping.claim(KEYS[:6], 3) == KEYS[:3] and other.claim(KEYS[:6], 1) == [KEYS[3]]
    stopping.finish([], {KEYS[2]: "RequestRefusedError: too long"})

    assert stopping.release(KEYS[:4]) == 2  # its live leases only: not its failure mark, not the other's lease

    summary = claims_summary(database)
    assert (summary.leased, summary.failed, summary.waiting) == (1, 1, 4)
    assert other.claim(KEYS[:6], 6) == [KEYS[0], KEYS[1], KEYS[4], KEYS[5]]  # long before the 600 s lease ends
    assert stopping.renew() == 0


def test_a_failed_input_is_reported_to_the_others_until_its_lease_ends(database: Database) -> None:
    a, b = WorkQueue(database, holder="a", lease_seconds=1.0), WorkQueue(database, holder="b")
    a.join(KEYS[:2])
    assert a.claim(KEYS[:2], 2) == KEYS[:2]
    database.put_many(RECORDS[:1])
    a.finish([KEYS[0]], {KEYS[1]: "RequestRefusedError: too long"})
    finished = time.monotonic()  # the failure's mark ends at most a lease after this
    state = b.state(KEYS[:2])
    assert state.stored == {KEYS[0]} and dict(state.failed) == {KEYS[1]: "RequestRefusedError: too long"}
    assert b.claim(KEYS[:2], 2) == []
    assert (claims_summary(database).failed, claims_summary(database).stale) == (1, 0)
    sleep_until(finished + 1.1)
    # Past its deadline a mark is still no lease: "a job died or stalled" was said of a batch that ended (was)
    assert (claims_summary(database).failed, claims_summary(database).stale) == (1, 0)
    assert b.claim(KEYS[:2], 2) == [KEYS[1]]  # a failure is never stored: tried again once its mark ends


def test_a_failure_mark_lasts_while_any_job_at_work_renews_then_a_lease(database: Database) -> None:
    """Was: the mark ended a lease after the failure, and every job that had not tried the input asked for it
    again, once each, over a run longer than a lease (the README says no other job of the run asks again)."""
    a, b = WorkQueue(database, holder="a", lease_seconds=1.0), WorkQueue(database, holder="b", lease_seconds=1.0)
    a.join(KEYS[:2])
    assert a.claim(KEYS[:2], 2) == KEYS[:2]
    a.finish([], {KEYS[1]: "RequestRefusedError: too long"})
    a.release([KEYS[0]])
    assert b.claim(KEYS[:2], 2) == [KEYS[0]]  # b at work on the batch, renewing as it works
    working_until = time.monotonic() + 2.5
    while time.monotonic() < working_until:  # more than two leases after the failure
        b.renew()
        time.sleep(0.3)
    assert dict(b.state(KEYS[:2]).failed) == {KEYS[1]: "RequestRefusedError: too long"}
    assert b.claim(KEYS[:2], 2) == []
    stopped = time.monotonic()  # no job renews any more: the mark ends a lease later
    sleep_until(stopped + 1.1)
    assert b.claim([KEYS[1]], 1) == [KEYS[1]]


def test_a_late_failure_of_a_lease_taken_over_leaves_the_new_holders_lease_alone(database: Database) -> None:
    late = WorkQueue(database, holder="late", lease_seconds=1.0)
    new = WorkQueue(database, holder="new", lease_seconds=60)
    late.join(KEYS[:1])
    assert late.claim(KEYS[:1], 1) == KEYS[:1]
    sleep_until(time.monotonic() + 1.1)  # the late job stalls past its lease
    assert new.claim(KEYS[:1], 1) == KEYS[:1]  # taken over
    late.finish([], {KEYS[0]: "RequestRefusedError: too long"})  # the stalled job's failure, reported late
    state = new.state(KEYS[:1])
    assert (state.leased, dict(state.failed), state.holders) == (1, {}, frozenset({"new"}))
    assert new.renew() == 1  # still the new holder's lease
    assert late.claim(KEYS[:1], 1) == []  # and still live


def test_a_renewal_that_waited_for_the_write_lock_runs_a_whole_lease_from_when_it_got_it(database: Database) -> None:
    # On PostgreSQL a write transaction waits for its schema's write lock first: a deadline measured from the
    # transaction's start (now()) would be a lease after the wait began, already past for a long wait.
    holder = WorkQueue(database, holder="holder", lease_seconds=2.0)
    holder.join(KEYS[:2])
    assert holder.claim(KEYS[:2], 2) == KEYS[:2]
    held = threading.Event()

    def long_write() -> None:  # a prune, a delete, an adoption: one write transaction holding the lock
        with database.transaction():
            held.set()
            time.sleep(3.0)  # longer than a lease: a deadline from the wait's start is past at the renewal

    writer = threading.Thread(target=long_write)
    writer.start()
    held.wait(10)
    time.sleep(0.2)
    assert holder.renew() == 2  # waited for the writer, then renewed
    renewed = time.monotonic()
    writer.join(timeout=30)
    newcomer = WorkQueue(database, holder="newcomer", lease_seconds=2.0)  # a job that never saw the lock
    claimed = newcomer.claim(KEYS[:2], 2)
    assert time.monotonic() - renewed < 1.5  # well within a lease of the renewal (else the next says nothing)
    assert claimed == []  # the lease runs from the renewal


def test_a_lease_that_expires_while_the_database_is_locked_is_spared_until_its_holder_can_renew(
    store_root: Path, descriptor: ModelDescriptor
) -> None:
    # Another process (a prune, a delete, a copy) holds the SQLite write lock past the holder's deadline: the
    # holder cannot renew meanwhile, so the jobs that waited for the lock too leave its lease alone for a while:
    # one whose claim waited, and one whose renewal waited and which claims once the lock is free.
    with Store(Settings(), root=store_root) as store:
        database = store.database("completions", "t", descriptor)
        holder = WorkQueue(database, holder="holder", lease_seconds=2.0)
        waiting_claim, waiting_renewal = (WorkQueue(database, holder=name, lease_seconds=2.0) for name in "cr")
        holder.join(KEYS[:2])
        assert holder.claim(KEYS[:2], 1) == KEYS[:1]
        claimed = time.monotonic()  # the deadline is at most a lease after this
        assert database.path is not None
        locker = sqlite3.connect(database.path, isolation_level=None)
        locker.execute("BEGIN IMMEDIATE")
        taken: list[str] = []
        waiting = [
            threading.Thread(target=lambda: taken.extend(waiting_claim.claim(KEYS[:2], 2))),
            threading.Thread(target=waiting_renewal.renew),
        ]
        for thread in waiting:
            thread.start()  # they wait for the lock from well before the deadline...
        sleep_until(claimed + 3.0)
        locker.execute("COMMIT")  # ...which has passed when they get it
        released = time.monotonic()
        locker.close()
        for thread in waiting:
            thread.join(timeout=30)
        assert taken == KEYS[1:2]
        assert waiting_renewal.claim(KEYS[:2], 2) == []  # its claim waited for nothing, but its renewal did
        assert holder.renew() == 1  # still the holder's, which renews it once the lock is free
        state = waiting_renewal.state(KEYS[:2])
        assert (state.leased, state.stale, state.holders) == (2, 0, frozenset({"holder", "c"}))
        sleep_until(released + 2.0 + 1.5)  # a holder that does not renew in time...
        assert waiting_renewal.claim(KEYS[:1], 1) == KEYS[:1]  # ...loses its lease as usual


def test_a_lease_that_expires_while_another_write_of_the_claimer_still_waits_is_spared(
    database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The claimer's renewal thread waits for the write lock (held by another process) while the holder's lease
    # expires; the claimer's own claim gets the lock first once it is free. The renewal has not seen the lock
    # end yet, but its wait says the database was locked: the holder could not renew either.
    holder = WorkQueue(database, holder="holder", lease_seconds=2.0)
    claimer = WorkQueue(database, holder="claimer", lease_seconds=2.0)
    holder.join(KEYS[:1])
    assert holder.claim(KEYS[:1], 1) == KEYS[:1]
    claimed = time.monotonic()  # the deadline is at most a lease after this
    let_go, claims = threading.Event(), database.claims

    def waiting_in_renewal(work: Any, *, write: bool = True) -> Any:
        if threading.current_thread().name == "renewal":
            let_go.wait(timeout=30)  # as if waiting for the lock
        return claims(work, write=write)

    monkeypatch.setattr(database, "claims", waiting_in_renewal)
    renewal = threading.Thread(target=claimer.renew, name="renewal")
    renewal.start()
    try:
        sleep_until(claimed + 2.3)
        assert claimer.claim(KEYS[:1], 1) == []  # spared
    finally:
        let_go.set()
        renewal.join(timeout=30)
    renewed = time.monotonic()
    sleep_until(renewed + 1.0 + 0.3)  # half a lease after the wait ended, a holder that has not renewed...
    assert claimer.claim(KEYS[:1], 1) == KEYS[:1]  # ...loses its lease as usual


def test_inputs_stored_while_the_state_is_read_are_never_unqueued(database: Database) -> None:
    # A job stores blocks and finishes them while another reads the batch's state: read in two statements (rows,
    # then claims) of a PostgreSQL transaction, each seeing the latest commits, an input stored and finished in
    # between was neither stored nor enqueued, and the reader enqueued its whole batch again.
    records = {r.input_hash: r for r in (completion_record(i) for i in range(300))}
    keys = list(records)
    WorkQueue(database, holder="setup").join(keys)
    finished = threading.Event()

    def work() -> None:
        queue = WorkQueue(database, holder="writer")
        try:
            while block := queue.claim(keys, 3):
                database.put_many([records[k] for k in block])
                queue.finish(block)
        finally:
            finished.set()

    watcher = WorkQueue(database, holder="watcher")
    writer = threading.Thread(target=work)
    writer.start()
    unqueued = []
    while not finished.is_set():
        unqueued.append(watcher.state(keys).unqueued)
    writer.join(timeout=60)
    assert len(unqueued) > 10 and not any(unqueued)
    assert len(watcher.state(keys).stored) == len(keys)


def test_sweep_deletes_only_what_is_left_behind(database: Database) -> None:
    queue = WorkQueue(database, holder="a", lease_seconds=0.1)
    queue.join(KEYS)
    queue.claim(KEYS, 2)
    database.put_many(RECORDS[2:3])
    assert sweep(database, grace_seconds=60) == 1  # the stored input's claim
    time.sleep(0.2)
    assert sweep(database, grace_seconds=60) == 0  # a stale lease is kept a while: it says a job died
    live = WorkQueue(database, holder="b", lease_seconds=60)
    assert live.claim(KEYS, 2) == KEYS[:2]  # taken over
    assert sweep(database, grace_seconds=0) == 7  # every waiting claim untouched since: only live leases stay
    summary = claims_summary(database)
    assert (summary.total, summary.leased, summary.jobs) == (2, 2, 1)


def test_concurrent_claimers_split_the_work_without_overlap(database: Database) -> None:
    keys = KEYS * 1  # ten inputs, four threads taking one at a time
    WorkQueue(database, holder="setup").join(keys)
    taken: dict[str, list[str]] = {}

    def work(name: str) -> None:
        queue = WorkQueue(database, holder=name)
        mine = taken.setdefault(name, [])
        while block := queue.claim(keys, 1):
            mine += block

    threads = [threading.Thread(target=work, args=(f"j{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    claimed = [k for block in taken.values() for k in block]
    assert sorted(claimed) == sorted(keys)


def _a_job_that_died_holding_two_leases(database: Database) -> None:
    """KEYS joined, 2 of them claimed with a lease of 0.1 s: stale a moment later."""
    dead = WorkQueue(database, holder="dead", lease_seconds=0.1)
    dead.join(KEYS)
    dead.claim(KEYS, 2)


def test_ls_stats_and_db_status_show_work_in_progress_and_flag_stale_leases(
    store_root: Path, descriptor: ModelDescriptor
) -> None:
    with _claims_database(store_root, descriptor) as database:
        _a_job_that_died_holding_two_leases(database)
        WorkQueue(database, holder="alive", lease_seconds=60).claim(KEYS, 3)
        time.sleep(0.2)
    judgestore = functools.partial(_judgestore, store_root)

    for command in LISTINGS:
        shown = judgestore(*command)
        assert "in progress: Qwen/Qwen3-8B" in shown.stdout and "3 leased by 1 job, 5 waiting, 2 stale" in shown.stdout
        assert "stale leases" in shown.stderr and "2 past their deadline" in shown.stderr
        assert "the batch's other jobs take them over" in " ".join(shown.stderr.split())
    (listed,) = orjson.loads(judgestore("ls", "--json").stdout)
    assert listed["claims"] | {"oldest_stale_deadline": None} == {
        "leased": 3, "stale": 2, "waiting": 5, "failed": 0, "done": 0, "jobs": 1, "oldest_stale_deadline": None,
    }  # fmt: skip
    (stats,) = orjson.loads(judgestore("stats", "--json").stdout)["databases"]
    assert stats["claims"]["stale"] == 2


def test_stale_leases_with_no_job_at_work_say_to_run_the_batch_again(
    store_root: Path, descriptor: ModelDescriptor
) -> None:
    """Every job of the batch died: the stale leases' line said the batch's other jobs would take them over (was)."""
    with _claims_database(store_root, descriptor) as database:
        _a_job_that_died_holding_two_leases(database)
        time.sleep(0.2)
    for command in LISTINGS:
        said = " ".join(_judgestore(store_root, *command).stderr.split())
        assert "2 past their deadline" in said and "if none is still running, run the batch again" in said, said
        assert "other jobs" not in said


def test_a_batch_whose_jobs_stopped_is_shown_left_over_not_in_progress(
    store_root: Path, descriptor: ModelDescriptor
) -> None:
    """Its last job stopped (Ctrl-C: its leases went back), no job at work: "in progress" for an hour (was)."""
    with _claims_database(store_root, descriptor) as database:
        WorkQueue(database, holder="stopped", lease_seconds=60).join(KEYS)
    judgestore = functools.partial(_judgestore, store_root)
    for command in LISTINGS:
        shown = " ".join(judgestore(*command).stdout.split())
        assert "in progress" not in shown
        assert "left over: Qwen/Qwen3-8B" in shown and "10 waiting; no job holds a lease" in shown, shown
    (listed,) = orjson.loads(judgestore("ls", "--json").stdout)
    assert (listed["claims"]["waiting"], listed["claims"]["leased"]) == (10, 0)


def test_a_listing_taken_while_leases_live_does_not_hide_them_turning_stale(
    store_root: Path, descriptor: ModelDescriptor
) -> None:
    # A job dies holding leases and nothing is written after: the files stay as they were when the last listing
    # read them, so a remembered listing would say "leased" forever.
    with _claims_database(store_root, descriptor) as database:
        WorkQueue(database, holder="dead", lease_seconds=2.5).join(KEYS)
        WorkQueue(database, holder="dead", lease_seconds=2.5).claim(KEYS, 2)
        claimed = time.monotonic()
    settled()  # a stamp of files just written is none (a catalog would not keep what it read)
    before = stamp(database.path)
    judgestore = functools.partial(_judgestore, store_root)

    for command in LISTINGS:
        live = judgestore(*command)
        assert "2 leased by 1 job, 8 waiting" in live.stdout and "stale" not in live.stdout + live.stderr
    sleep_until(claimed + 2.6)
    for command in LISTINGS:
        shown = judgestore(*command)
        assert "8 waiting, 2 stale" in shown.stdout and "2 past their deadline" in shown.stderr
    assert stamp(database.path) == before  # the file's catalog stamp is what it was: nothing was written


LISTINGS = (["ls"], ["stats"], ["db", "status"])  # the commands that show a database's claims


@contextmanager
def _claims_database(store_root: Path, descriptor: ModelDescriptor) -> Iterator[Database]:
    """The completions database of ``descriptor`` in a store at ``store_root``, closed after."""
    with Store(Settings(), root=store_root) as store:
        yield store.database("completions", "t", descriptor)


def _judgestore(store_root: Path, *args: str) -> Any:
    from typer.testing import CliRunner

    from store.cli.app import build_app

    result = CliRunner().invoke(build_app(), [*args, "--store-root", str(store_root)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result
